"""Schemathesis fuzzing from the server's own OpenAPI document: no 5xx, and the
server still answers afterwards."""

from __future__ import annotations

import pytest
from fake_engine import FakeEngine

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, settings  # noqa: E402
from schemathesis.checks import not_a_server_error  # noqa: E402

from augury.server import ServerConfig, create_app  # noqa: E402

APP = create_app(FakeEngine(max_model_len=512, token_delay_s=0.0), ServerConfig(default_max_tokens=8))
schema = schemathesis.openapi.from_asgi("/openapi.json", APP)


@pytest.mark.slow
@schema.parametrize()
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_server_errors(case):
    case.call_and_validate(checks=[not_a_server_error])


@pytest.mark.slow
def test_still_serving_after_fuzzing():
    from fastapi.testclient import TestClient

    c = TestClient(APP)
    r = c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3})
    assert r.status_code == 200
    assert c.get("/health").json()["status"] == "ok"
