"""The API's `kv_cache` field on a server that stores several codecs (tiny model, live server)."""

from __future__ import annotations

import httpx
import pytest

from augury.engine.engine import Engine
from tests.conftest import make_tiny_hf_model
from tests.server.conftest import start_server


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    d = make_tiny_hf_model(tmp_path_factory.mktemp("kv_api"), "llama", hidden_size=128,
                           num_attention_heads=2, num_key_value_heads=1)
    engine = Engine.from_model(str(d), device="cpu", dtype="float32", progress=False, kv_budget="4MiB",
                               kv_quant="turbo", kv_extra_codecs="native")
    live = start_server(engine)
    yield live.url, engine
    live.stop()
    engine.shutdown()


def _body(engine, **kw):
    return {"model": engine.model_id, "prompt": list(range(5, 60)), "max_tokens": 8, "temperature": 0,
            "ignore_eos": True, **kw}


def test_usage_reports_each_requests_codec_and_boundary(server):
    url, engine = server
    r = httpx.post(f"{url}/v1/completions", json=_body(engine)).json()
    assert r["usage"]["kv_cache"] == {"codec": "turbo-k8v3", "start": 0, "boundary": 0, "sliding": None}
    r = httpx.post(f"{url}/v1/completions", json=_body(engine, kv_cache={"codec": "native"})).json()
    assert r["usage"]["kv_cache"]["codec"] == "native"
    r = httpx.post(f"{url}/v1/completions", json=_body(engine, kv_cache={"codec": "turbo", "start": 20})).json()
    assert r["usage"]["kv_cache"] == {"codec": "turbo-k8v3", "start": 20, "boundary": 32, "sliding": None}


def test_a_codec_the_server_does_not_store_is_a_400(server):
    url, engine = server
    r = httpx.post(f"{url}/v1/completions", json=_body(engine, kv_cache={"codec": "affine", "key_bits": 4}))
    assert r.status_code == 400
    err = r.json()["error"]
    assert "kv-extra-codecs" in err["message"] and err["type"] == "invalid_request_error"
