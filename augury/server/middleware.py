"""ASGI guard in front of every route: API key, body size limit, request metrics.

A plain ASGI middleware (not BaseHTTPMiddleware) so streamed responses and
client disconnects pass through untouched.
"""

from __future__ import annotations

import hmac
from typing import Any

from augury.server.config import ServerConfig
from augury.server.errors import APIError, error_response
from augury.server.metrics import ServerMetrics

# the chat page itself holds nothing secret; its API calls carry the key
_OPEN_PATHS = ("/health",)
_PAGE_PATHS = ("/", "/static/", "/favicon.ico")


def _header(scope: dict, name: bytes) -> str | None:
    for k, v in scope.get("headers", ()):
        if k.lower() == name:
            return v.decode("latin-1")
    return None


def key_ok(scope: dict, api_key: str) -> bool:
    given = _header(scope, b"x-api-key")
    auth = _header(scope, b"authorization")
    if given is None and auth and auth[:7].lower() == "bearer ":
        given = auth[7:].strip()
    return given is not None and hmac.compare_digest(given.encode(), api_key.encode())


def needs_key(path: str, method: str) -> bool:
    if path in _OPEN_PATHS:
        return False
    if method in ("GET", "HEAD") and (path == "/" or path.startswith("/static/") or path == "/favicon.ico"):
        return False
    return True


class GuardMiddleware:
    def __init__(self, app: Any, config: ServerConfig, metrics: ServerMetrics, routes: set[str]) -> None:
        self.app = app
        self.config = config
        self.metrics = metrics
        self.routes = routes

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path, method = scope["path"], scope["method"]
        route = path if path in self.routes else ("/v1/models/{id}" if path.startswith("/v1/models/") else "other")
        status = {"code": 500}

        async def counted_send(message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            await self._guarded(scope, receive, counted_send, path, method)
        finally:
            self.metrics.requests.labels(route=route, status=str(status["code"])).inc()

    async def _guarded(self, scope, receive, send, path: str, method: str) -> None:
        cfg = self.config
        if cfg.api_key and needs_key(path, method) and not key_ok(scope, cfg.api_key):
            err = APIError(401, "missing or invalid API key: send 'Authorization: Bearer <key>' or 'x-api-key: <key>'",
                           code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
            await error_response(path, err)(scope, receive, send)
            return
        if method not in ("POST", "PUT", "PATCH"):
            await self.app(scope, receive, send)
            return
        too_large = APIError(413, f"request body is larger than the limit of {cfg.max_body_bytes} bytes",
                             code="request_too_large")
        declared = _header(scope, b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > cfg.max_body_bytes:
            await error_response(path, too_large)(scope, receive, send)
            return
        # read the body here (bounded) and replay it, so the limit holds for chunked uploads too
        chunks, size = [], 0
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                return
            body = msg.get("body", b"")
            size += len(body)
            if size > cfg.max_body_bytes:
                await error_response(path, too_large)(scope, receive, send)
                return
            chunks.append(body)
            if not msg.get("more_body", False):
                break
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)
