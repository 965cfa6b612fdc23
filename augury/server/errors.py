"""API errors and their two wire formats (OpenAI and Anthropic).

Handlers raise `APIError`; the app renders it in the format of the route's
API (paths under /v1/messages speak Anthropic, everything else OpenAI).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from fastapi.responses import JSONResponse

try:  # the engine's own exception when its queue is full (-> 429)
    from augury.engine.errors import EngineFull
except ImportError:  # engine not built yet: a stand-in with the same name

    class EngineFull(Exception):  # type: ignore[no-redef]
        """The engine's waiting queue is full."""


# HTTP status -> Anthropic error type (https://docs.anthropic.com/en/api/errors)
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
}
_OPENAI_TYPES = {
    401: "authentication_error",
    404: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "server_error",
}


_UNION_BRANCH = re.compile(r"^([A-Z]|(str|int|float|bool|dict|list|none|literal|function-|tagged-union|json-or-python)\b)|.*[\[\]'(]")


@dataclass
class APIError(Exception):
    status: int
    message: str
    param: str | None = None
    code: str | None = None
    headers: dict[str, str] = field(default_factory=dict)

    def __str__(self) -> str:
        return self.message


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def from_value_error(e: ValueError) -> APIError:
    """The engine's ValueError("field: reason") -> 400 naming that field."""
    msg = str(e) or "invalid request"
    head = msg.split(":", 1)[0].strip()
    param = head if head and " " not in head else None
    return APIError(400, msg, param=param)


def is_anthropic_path(path: str) -> bool:
    return path.startswith("/v1/messages")


def openai_body(err: APIError) -> dict:
    etype = _OPENAI_TYPES.get(err.status, "invalid_request_error")
    return {"error": {"message": err.message, "type": etype, "param": err.param, "code": err.code}}


def anthropic_body(err: APIError) -> dict:
    etype = _ANTHROPIC_TYPES.get(err.status, "api_error" if err.status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": etype, "message": err.message}}


def error_response(path: str, err: APIError) -> JSONResponse:
    body = anthropic_body(err) if is_anthropic_path(path) else openai_body(err)
    return JSONResponse(body, status_code=err.status, headers=err.headers or None)


def validation_param(loc: tuple) -> str:
    """pydantic loc ('body', 'messages', 0, 'role') -> 'messages[0].role'."""
    out = ""
    for part in loc:
        if part in ("body", "query", "path") and not out:
            continue
        if isinstance(part, int):
            out += f"[{part}]"
        elif _UNION_BRANCH.match(str(part)):
            continue  # pydantic's union branch names ('str', 'list[str]', 'ToolCall') say nothing to a user
        else:
            out += ("." if out else "") + str(part)
    return out
