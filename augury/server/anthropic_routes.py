"""Anthropic Messages API: POST /v1/messages (plain and streamed)."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from augury.engine.types import SamplingParams
from augury.server import convert
from augury.server.errors import APIError, anthropic_body, bad_request
from augury.server.schemas_anthropic import MessagesRequest, TextBlock, ToolResultBlock, ToolUseBlock
from augury.server.sse import SSE_HEADERS, named_event
from augury.server.streaming import DisconnectAwareStream, collect_unless_disconnected, merge, submit_all, final_or_500
from augury.server.tool_calls import CallDelta, ContentDelta, StreamingToolParser, parse_tool_calls

router = APIRouter()


def _messages(body: MessagesRequest) -> list[dict]:
    out: list[dict] = []
    if body.system:
        system = body.system if isinstance(body.system, str) else "".join(b.text for b in body.system)
        out.append({"role": "system", "content": system})
    names: dict[str, str] = {}
    for i, m in enumerate(body.messages):
        if isinstance(m.content, str):
            out.append({"role": m.role, "content": m.content})
            continue
        text: list[str] = []
        calls: list[dict] = []
        for b in m.content:
            if isinstance(b, TextBlock):
                text.append(b.text)
            elif isinstance(b, ToolUseBlock):
                if m.role != "assistant":
                    raise bad_request(f"messages[{i}].content: tool_use blocks belong to assistant turns")
                names[b.id] = b.name
                calls.append({"id": b.id, "type": "function", "function": {"name": b.name, "arguments": b.input}})
            elif isinstance(b, ToolResultBlock):
                if m.role != "user":
                    raise bad_request(f"messages[{i}].content: tool_result blocks belong to user turns")
                result = b.content if isinstance(b.content, str) or b.content is None else "".join(t.text for t in b.content)
                out.append({"role": "tool", "tool_call_id": b.tool_use_id, "name": names.get(b.tool_use_id, ""),
                            "content": ("Error: " if b.is_error else "") + (result or "")})
        if text or calls:
            msg: dict[str, Any] = {"role": m.role, "content": "".join(text)}
            if calls:
                msg["tool_calls"] = calls
            out.append(msg)
    return out


def _tools(body: MessagesRequest) -> tuple[list[convert.ToolSpec], str, str | None]:
    tools = [convert.ToolSpec(t.name, t.description, t.input_schema) for t in body.tools or []]
    choice = body.tool_choice.type if body.tool_choice else ("auto" if tools else "none")
    if not tools:
        if choice in ("any", "tool"):
            raise bad_request("tool_choice: needs a non-empty 'tools' list")
        return tools, "none", None
    if choice == "none":
        return tools, "none", None
    if choice == "auto":
        return tools, "parse", None
    if choice == "any":
        return tools, "forced", None
    if not body.tool_choice.name:
        raise bad_request("tool_choice.name: required when type is 'tool'")
    return tools, "forced", body.tool_choice.name


def _stop_reason(finish: str | None, has_tools: bool) -> str:
    if has_tools:
        return "tool_use"
    return "max_tokens" if finish == "length" else "end_turn"


def _input(arguments: str) -> dict:
    try:
        val = json.loads(arguments or "{}")
    except json.JSONDecodeError:
        return {}
    return val if isinstance(val, dict) else {"value": val}


def _tool_id() -> str:
    return "toolu_" + uuid.uuid4().hex[:24]


@router.post("/v1/messages")
async def messages(body: MessagesRequest, request: Request):
    t0 = time.monotonic()
    engine, cfg, metrics = request.app.state.engine, request.app.state.config, request.app.state.metrics
    model = convert.resolve_model(engine, body.model)
    msgs = _messages(body)
    tools, tool_mode, forced = _tools(body)
    structured = convert.forced_tool_spec(tools, forced) if tool_mode == "forced" else None
    try:
        prompt_ids = await asyncio.to_thread(engine.tokenizer.encode_chat, msgs, tools=convert.template_tools(tools),
                                             add_generation_prompt=True)
    except Exception as e:
        raise bad_request(f"messages: the chat template could not render these messages: {e}") from e
    max_tokens = convert.resolve_max_tokens(engine, len(prompt_ids), body.max_tokens, None)
    params = convert.validated(SamplingParams(
        max_tokens=max_tokens,
        temperature=1.0 if body.temperature is None else body.temperature,
        top_p=1.0 if body.top_p is None else body.top_p,
        top_k=body.top_k or 0,
        stop=convert.stop_list(body.stop_sequences, "stop_sequences"),
        structured=structured,
        speculative=body.speculative_param(),
        kv_cache=body.kv_cache_param(),
    ))
    handles = await asyncio.to_thread(submit_all, engine, [(prompt_ids, params)], cfg.retry_after_s)
    mid = "msg_" + uuid.uuid4().hex[:24]
    fmt = "llama3_json" if tool_mode == "forced" else cfg.tool_parser
    names = {t.name for t in tools}
    if body.stream:
        gen = _stream(handles, metrics, t0, mid, model, len(prompt_ids), tool_mode, fmt, names)
        return DisconnectAwareStream(gen, media_type="text/event-stream", headers=SSE_HEADERS)

    (seq,) = await collect_unless_disconnected(request, handles, metrics, t0)
    final = final_or_500(seq)
    text = "".join(o.text for o in seq)
    content: list[dict] = []
    calls = []
    if tool_mode != "none":
        text, calls = parse_tool_calls(text, fmt, names)
    if text.strip() or not calls:
        content.append({"type": "text", "text": text})
    for c in calls:
        content.append({"type": "tool_use", "id": _tool_id(), "name": c.name, "input": _input(c.arguments)})
    return JSONResponse({
        "id": mid, "type": "message", "role": "assistant", "model": model, "content": content,
        "stop_reason": _stop_reason(final.finish_reason, bool(calls)), "stop_sequence": None,
        "usage": {"input_tokens": final.prompt_tokens, "output_tokens": final.completion_tokens,
                  "cache_read_input_tokens": final.cached_tokens, "cache_creation_input_tokens": 0,
                  **({"speculation": final.speculation} if final.speculation else {}),
                  **({"kv_cache": final.kv_cache} if getattr(final, "kv_cache", None) else {})},
    })


async def _stream(handles, metrics, t0, mid, model, prompt_len, tool_mode, fmt, names):
    parser = StreamingToolParser(fmt, names) if tool_mode != "none" else None
    block = -1  # index of the open content block
    open_kind: str | None = None
    n_calls = 0
    yield named_event("message_start", {"type": "message_start", "message": {
        "id": mid, "type": "message", "role": "assistant", "model": model, "content": [],
        "stop_reason": None, "stop_sequence": None,
        "usage": {"input_tokens": prompt_len, "output_tokens": 0}}})

    def close() -> list[bytes]:
        return [named_event("content_block_stop", {"type": "content_block_stop", "index": block})] if open_kind else []

    try:
        async for _, out in merge(handles, metrics, t0):
            if out.error or out.finish_reason == "error":
                raise APIError(500, f"generation failed: {out.error or 'engine error'}")
            events = (parser.feed(out.text) + (parser.finish() if out.finished else [])) if parser else (
                [ContentDelta(out.text)] if out.text else [])
            for ev in events:
                if isinstance(ev, ContentDelta):
                    if open_kind != "text":
                        if not ev.text.strip() and open_kind is None and parser is not None:
                            continue  # whitespace before a tool call is not worth a block
                        for b in close():
                            yield b
                        block, open_kind = block + 1, "text"
                        yield named_event("content_block_start", {"type": "content_block_start", "index": block,
                                                                  "content_block": {"type": "text", "text": ""}})
                    yield named_event("content_block_delta", {"type": "content_block_delta", "index": block,
                                                              "delta": {"type": "text_delta", "text": ev.text}})
                elif isinstance(ev, CallDelta):
                    if ev.id is not None:
                        for b in close():
                            yield b
                        block, open_kind = block + 1, "tool"
                        n_calls += 1
                        yield named_event("content_block_start", {"type": "content_block_start", "index": block,
                                                                  "content_block": {"type": "tool_use", "id": _tool_id(),
                                                                                    "name": ev.name, "input": {}}})
                    if ev.arguments:
                        yield named_event("content_block_delta", {"type": "content_block_delta", "index": block,
                                                                  "delta": {"type": "input_json_delta",
                                                                            "partial_json": ev.arguments}})
            if out.finished:
                if open_kind is None:  # always at least one (possibly empty) text block
                    block, open_kind = 0, "text"
                    yield named_event("content_block_start", {"type": "content_block_start", "index": 0,
                                                              "content_block": {"type": "text", "text": ""}})
                for b in close():
                    yield b
                open_kind = None
                yield named_event("message_delta", {"type": "message_delta",
                                                    "delta": {"stop_reason": _stop_reason(out.finish_reason, n_calls > 0),
                                                              "stop_sequence": None},
                                                    "usage": {"output_tokens": out.completion_tokens}})
                yield named_event("message_stop", {"type": "message_stop"})
    except APIError as e:
        yield named_event("error", anthropic_body(e))
