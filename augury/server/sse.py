"""Server-sent events framing for both APIs."""

from __future__ import annotations

import json


def data_event(payload: dict | str) -> bytes:
    """OpenAI style: `data: {...}` lines; `[DONE]` is a bare string."""
    body = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    return f"data: {body}\n\n".encode()


def named_event(event: str, payload: dict) -> bytes:
    """Anthropic style: every event carries its `event:` name and a JSON body with the same type."""
    body = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    return f"event: {event}\ndata: {body}\n\n".encode()


SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no", "Connection": "keep-alive"}
