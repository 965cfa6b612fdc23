"""Every 4xx path: status code and the error body in the route's own API format."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from fake_engine import FakeEngine

from augury.server import ServerConfig, create_app

MSG = [{"role": "user", "content": "hi"}]


def make(engine=None, **cfg) -> TestClient:
    return TestClient(create_app(engine or FakeEngine(), ServerConfig(**cfg)))


@pytest.fixture(scope="module")
def c() -> TestClient:
    return make()


def openai_err(r, status: int, param: str | None = None, code: str | None = None, contains: str = "") -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["message"] and contains in err["message"]
    if param is not None:
        assert err["param"] == param
    if code is not None:
        assert err["code"] == code
    return err


def anthropic_err(r, status: int, etype: str, contains: str = "") -> dict:
    assert r.status_code == status, r.text
    body = r.json()
    assert body["type"] == "error" and body["error"]["type"] == etype
    assert contains in body["error"]["message"]
    return body["error"]


@pytest.mark.parametrize("field,value", [
    ("temperature", -1), ("temperature", "hot"), ("top_p", 0), ("top_p", 1.5), ("top_k", -5), ("min_p", 2),
    ("presence_penalty", 3), ("frequency_penalty", -3), ("repetition_penalty", 0), ("n", 0), ("n", 99),
    ("max_tokens", 0), ("max_completion_tokens", -2), ("top_logprobs", 21), ("stream", "maybe"),
    ("stop", 5), ("seed", "x"),
])
def test_invalid_chat_field_names_it(c, field, value):
    r = c.post("/v1/chat/completions", json={"messages": MSG, field: value})
    openai_err(r, 400, param=field, contains=field)


def test_invalid_message_role_and_missing_messages(c):
    openai_err(c.post("/v1/chat/completions", json={"messages": [{"role": "wizard", "content": "x"}]}), 400,
               param="messages[0].role")
    openai_err(c.post("/v1/chat/completions", json={"model": "x"}), 400, param="messages")
    openai_err(c.post("/v1/chat/completions", json={"messages": []}), 400, param="messages")


def test_non_text_content_part(c):
    msgs = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x"}}]}]
    openai_err(c.post("/v1/chat/completions", json={"messages": msgs}), 400, param="messages[0].content[0].type")


def test_bad_json_body(c):
    r = c.post("/v1/chat/completions", content=b"{not json", headers={"content-type": "application/json"})
    openai_err(r, 400, contains="JSON")


def test_unknown_fields_ignored(c):
    r = c.post("/v1/chat/completions", json={"messages": MSG, "max_tokens": 2, "frobnicate": True, "store": False})
    assert r.status_code == 200


def test_unknown_model_404(c):
    openai_err(c.post("/v1/chat/completions", json={"model": "gpt-9", "messages": MSG}), 404,
               param="model", code="model_not_found")
    openai_err(c.get("/v1/models/gpt-9"), 404, code="model_not_found")
    anthropic_err(c.post("/v1/messages", json={"model": "claude-9", "max_tokens": 5, "messages": MSG}), 404,
                  "not_found_error", "claude-9")


def test_unknown_route_and_method(c):
    openai_err(c.get("/v1/nothing"), 404)
    openai_err(c.get("/v1/chat/completions"), 405)


def test_context_window_exceeded_names_both_numbers():
    c = make(FakeEngine(max_model_len=100))
    r = c.post("/v1/chat/completions", json={"messages": MSG, "max_tokens": 90})
    err = openai_err(r, 400, param="max_tokens", code="context_length_exceeded")
    assert "90" in err["message"] and "100" in err["message"]
    long = [{"role": "user", "content": "x" * 200}]
    err = openai_err(c.post("/v1/chat/completions", json={"messages": long}), 400, code="context_length_exceeded")
    assert "100" in err["message"]
    r = c.post("/v1/messages", json={"model": "fake", "max_tokens": 95, "messages": MSG})
    anthropic_err(r, 400, "invalid_request_error", "100")


def test_queue_full_429_with_retry_after():
    c = make(FakeEngine(max_queue=0), retry_after_s=3)
    r = c.post("/v1/chat/completions", json={"messages": MSG})
    openai_err(r, 429, code="queue_full")
    assert r.headers["retry-after"] == "3"
    r = c.post("/v1/messages", json={"model": "fake", "max_tokens": 5, "messages": MSG})
    anthropic_err(r, 429, "rate_limit_error")
    assert r.headers["retry-after"] == "3"


def test_body_size_limit_413():
    c = make(max_body_bytes=2048)
    r = c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x" * 5000}]})
    openai_err(r, 413, code="request_too_large")
    r = c.post("/v1/messages", json={"model": "fake", "max_tokens": 5, "messages": [{"role": "user", "content": "x" * 5000}]})
    anthropic_err(r, 413, "request_too_large")

    def chunks():  # no content-length: the limit still holds
        for _ in range(10):
            yield b"x" * 1000

    r = c.post("/v1/chat/completions", content=chunks(), headers={"content-type": "application/json"})
    openai_err(r, 413)


def test_api_key_required_except_health():
    c = make(api_key="s3cret")
    assert c.get("/health").status_code == 200
    assert c.get("/").status_code == 200  # the chat page; its API calls carry the key
    openai_err(c.get("/v1/models"), 401, code="invalid_api_key")
    openai_err(c.get("/metrics"), 401)
    openai_err(c.get("/v1/models", headers={"Authorization": "Bearer wrong"}), 401)
    anthropic_err(c.post("/v1/messages", json={}), 401, "authentication_error")
    assert c.get("/v1/models", headers={"Authorization": "Bearer s3cret"}).status_code == 200
    assert c.get("/v1/models", headers={"x-api-key": "s3cret"}).status_code == 200
    r = c.post("/v1/messages", headers={"x-api-key": "s3cret"},
               json={"model": "fake", "max_tokens": 3, "messages": MSG})
    assert r.status_code == 200


def test_logit_bias_checked(c):
    openai_err(c.post("/v1/chat/completions", json={"messages": MSG, "logit_bias": {"abc": 1}}), 400, param="logit_bias")
    openai_err(c.post("/v1/chat/completions", json={"messages": MSG, "logit_bias": {"999999": 1}}), 400, param="logit_bias")
    openai_err(c.post("/v1/chat/completions", json={"messages": MSG, "logit_bias": {"5": 500}}), 400, param="logit_bias")


def test_tool_and_format_errors(c):
    openai_err(c.post("/v1/chat/completions", json={"messages": MSG, "tool_choice": "required"}), 400, param="tool_choice")
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    choice = {"type": "function", "function": {"name": "g"}}
    openai_err(c.post("/v1/chat/completions", json={"messages": MSG, "tools": tools, "tool_choice": choice}), 400,
               param="tool_choice", contains="'g'")
    openai_err(c.post("/v1/chat/completions", json={"messages": MSG, "response_format": {"type": "json_schema"}}), 400,
               param="response_format.json_schema")
    bad = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "properties": {"a": {"type": "nope"}}}}}
    openai_err(c.post("/v1/chat/completions", json={"messages": MSG, "response_format": bad}), 400, param="response_format")
    openai_err(c.post("/v1/chat/completions", json={"messages": MSG, "response_format": {"type": "xml"}}), 400,
               param="response_format.type")
    openai_err(c.post("/v1/chat/completions", json={"messages": MSG, "top_logprobs": 2}), 400, param="top_logprobs")
    tool_msg = [{"role": "tool", "content": "x"}]
    openai_err(c.post("/v1/chat/completions", json={"messages": tool_msg}), 400, param="messages[0].tool_call_id")


def test_completions_errors(c):
    openai_err(c.post("/v1/completions", json={"prompt": []}), 400, param="prompt")
    openai_err(c.post("/v1/completions", json={"prompt": [1, 2, 10**9]}), 400, param="prompt")
    openai_err(c.post("/v1/completions", json={}), 400, param="prompt")


@pytest.mark.parametrize("body,contains", [
    ({"model": "fake", "messages": MSG}, "max_tokens"),
    ({"model": "fake", "max_tokens": 0, "messages": MSG}, "max_tokens"),
    ({"model": "fake", "max_tokens": 5, "messages": []}, "messages"),
    ({"model": "fake", "max_tokens": 5, "messages": MSG, "temperature": 1.5}, "temperature"),
    ({"model": "fake", "max_tokens": 5, "messages": [{"role": "system", "content": "x"}]}, "role"),
    ({"model": "fake", "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, "content"),
    ({"model": "fake", "max_tokens": 5, "messages": MSG, "tool_choice": {"type": "any"}}, "tool_choice"),
    ({"model": "fake", "max_tokens": 5, "messages": MSG, "stop_sequences": "x"}, "stop_sequences"),
])
def test_anthropic_invalid_requests(c, body, contains):
    anthropic_err(c.post("/v1/messages", json=body), 400, "invalid_request_error", contains)


def test_server_keeps_serving_after_errors(c):
    for _ in range(3):
        c.post("/v1/chat/completions", json={"messages": "bad"})
    assert c.post("/v1/chat/completions", json={"messages": MSG, "max_tokens": 3}).status_code == 200
