"""The API's `speculative` field and usage.speculation, on a live server (tiny model)."""

from __future__ import annotations

import threading
import time

import httpx
import pytest
import uvicorn

from augury.engine.engine import Engine
from augury.server.app import create_app
from augury.server.config import ServerConfig


@pytest.fixture(scope="module")
def server(tiny_llama_dir):
    engine = Engine.from_model(str(tiny_llama_dir), device="cpu", dtype="float32", progress=False,
                               kv_budget="8MiB", spec_layers=1, spec_adaptive=False)
    cfg = ServerConfig(port=0)
    app = create_app(engine, cfg)
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    t = threading.Thread(target=srv.run, daemon=True)
    t.start()
    while not srv.started:
        time.sleep(0.05)
    port = srv.servers[0].sockets[0].getsockname()[1]
    yield f"http://127.0.0.1:{port}", engine
    srv.should_exit = True
    t.join(timeout=10)
    engine.shutdown()


BODY = {"prompt": "Hello world! This is a tiny tokenizer for tests. Hello world! This is",
        "max_tokens": 24, "temperature": 0, "ignore_eos": True}


def test_speculation_usage_and_same_text(server):
    url, engine = server
    body = {**BODY, "model": engine.model_id}
    plain = httpx.post(f"{url}/v1/completions", json={**body, "speculative": False}).json()
    assert "speculation" not in plain["usage"]
    for method in ("ngram", "layerskip"):
        r = httpx.post(f"{url}/v1/completions",
                       json={**body, "speculative": {"method": method, "num_draft_tokens": 4}}).json()
        assert r["choices"][0]["text"] == plain["choices"][0]["text"]
        s = r["usage"]["speculation"]
        assert s["method"] == method and s["rounds"] > 0 and set(s) >= {
            "drafted", "accepted", "acceptance_rate", "mean_accepted_length", "accepted_by_position"}
    metrics = httpx.get(f"{url}/metrics").text
    assert "augury_spec_rounds" in metrics


def test_unavailable_method_is_a_400(server):
    url, engine = server
    body = {**BODY, "model": engine.model_id}
    r = httpx.post(f"{url}/v1/completions", json={**body, "speculative": {"method": "draft-model"}})
    assert r.status_code == 400
    assert "draft-model" in r.json()["error"]["message"]
    r = httpx.post(f"{url}/v1/completions", json={**body, "speculative": {"method": "bogus"}})
    assert r.status_code == 400
