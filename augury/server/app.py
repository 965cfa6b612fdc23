"""The FastAPI app: routes, error formats, middleware, and how to run it."""

from __future__ import annotations

import logging
import time
from importlib import resources
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from augury.server import anthropic_routes, openai_routes, routes_admin
from augury.server.config import ServerConfig
from augury.server.errors import APIError, error_response, validation_param
from augury.server.metrics import ServerMetrics
from augury.server.middleware import GuardMiddleware

log = logging.getLogger("augury.server")


def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    errs = exc.errors()
    first = errs[0] if errs else {"loc": (), "msg": "invalid request"}
    param = validation_param(tuple(first.get("loc", ())))
    if first.get("type") == "json_invalid":
        msg, param = "the request body is not valid JSON", None
    elif first.get("type") == "missing":
        msg = f"{param}: field required"
    else:
        msg = f"{param}: {first.get('msg', 'invalid value')}" if param else str(first.get("msg"))
    return error_response(request.url.path, APIError(400, msg, param=param or None, code="invalid_value"))


def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    msg = {404: f"no route {request.method} {request.url.path}", 405: f"method {request.method} not allowed here"}
    return error_response(request.url.path, APIError(exc.status_code, msg.get(exc.status_code, str(exc.detail)),
                                                     headers=dict(exc.headers or {})))


def _server_error(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error on %s", request.url.path)
    return error_response(request.url.path, APIError(500, f"internal error: {type(exc).__name__}: {exc}"))


def _chat_page() -> str:
    return resources.files("augury.server").joinpath("static/index.html").read_text(encoding="utf-8")


def create_app(engine: Any, config: ServerConfig | None = None) -> FastAPI:
    """An app serving `engine` (see augury/engine/engine.py for the contract)."""
    config = config or ServerConfig()
    config.validate()
    app = FastAPI(title="augury", version="0.1.0",
                  description="Local LLM inference: OpenAI- and Anthropic-compatible API")
    metrics = ServerMetrics(engine)
    app.state.engine = engine
    app.state.config = config
    app.state.metrics = metrics
    app.state.started = int(time.time())

    app.add_exception_handler(APIError, lambda r, e: error_response(r.url.path, e))
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(Exception, _server_error)
    app.include_router(openai_routes.router)
    app.include_router(anthropic_routes.router)
    app.include_router(routes_admin.router)

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok", "model": engine.model_id}

    @app.get("/metrics")
    async def metrics_route() -> Response:
        return Response(metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    if config.enable_web_chat:
        page = _chat_page()

        @app.get("/", include_in_schema=False)
        async def index() -> HTMLResponse:
            return HTMLResponse(page)

    # metric labels: known paths only (fuzzers must not explode the label set)
    routers = (openai_routes.router, anthropic_routes.router)
    routes = {getattr(r, "path", "") for rt in (app, *routers) for r in rt.routes} - {""}
    app.add_middleware(GuardMiddleware, config=config, metrics=metrics, routes=routes)
    return app


def warn_if_exposed(config: ServerConfig) -> str | None:
    """Binding beyond loopback without a key serves the model to the network."""
    if config.is_loopback or config.api_key:
        return None
    msg = (f"warning: listening on {config.host} without --api-key; anyone who can reach this "
           "address can use the model. Pass --api-key KEY or bind 127.0.0.1.")
    log.warning(msg)
    print(msg, flush=True)
    return msg


def run_server(engine: Any, config: ServerConfig | None = None, log_level: str = "info") -> None:
    """Serve until interrupted (blocking)."""
    import uvicorn

    config = config or ServerConfig()
    app = create_app(engine, config)
    warn_if_exposed(config)
    uvicorn.run(app, host=config.host, port=config.port, log_level=log_level,
                timeout_graceful_shutdown=5, limit_concurrency=None)


def serve(engine: Any, host: str = "127.0.0.1", port: int = 8080, api_key: str | None = None,
          max_body_bytes: int = 8 * 1024 * 1024, tool_parser: str = "auto", log_level: str = "info") -> None:
    """What `augury serve` calls once it has built the engine."""
    run_server(engine, ServerConfig(host=host, port=port, api_key=api_key, max_body_bytes=max_body_bytes,
                                    tool_parser=tool_parser), log_level=log_level)
