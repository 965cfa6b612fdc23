"""The official `openai` client against a live server (fake engine; SmolLM2 when marked real)."""

from __future__ import annotations

import json

import openai
import pytest

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 24}},
                       "required": ["city"], "additionalProperties": False},
    },
}
PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 16}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}


@pytest.fixture(scope="module")
def client(live):
    return openai.OpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def _chat(client, content, **kw):
    kw.setdefault("max_tokens", 24)
    kw.setdefault("temperature", 0)
    return client.chat.completions.create(model=kw.pop("model", "smollm2" if False else None) or _model(client),
                                          messages=[{"role": "user", "content": content}], **kw)


def _model(client) -> str:
    return client.models.list().data[0].id


def test_models_lists_loaded_model(client, live):
    models = client.models.list().data
    assert [m.id for m in models] == [live.engine.model_id]
    assert client.models.retrieve(live.engine.model_id).id == live.engine.model_id


def test_chat_basic(client, live):
    r = _chat(client, "SAY: Hello there" if live.kind == "fake" else "What is the capital of France?")
    assert r.object == "chat.completion"
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content
    assert r.choices[0].finish_reason in ("stop", "length")
    assert r.usage.prompt_tokens > 0 and r.usage.completion_tokens > 0
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    assert r.usage.prompt_tokens_details.cached_tokens >= 0
    if live.kind == "fake":
        assert r.choices[0].message.content == "Hello there"


def test_chat_stream_matches_plain_and_ends_with_usage(client, live):
    prompt = "SAY: stream ✓ 🙂 me" if live.kind == "fake" else "Name three colors."
    plain = _chat(client, prompt).choices[0].message.content
    chunks = list(_chat(client, prompt, stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == plain
    assert chunks[0].choices[0].delta.role == "assistant"
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finishes) == 1
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0


def test_stop_string_never_leaks(client, live):
    if live.kind == "fake":
        r = _chat(client, "SAY: one two STOP three", stop=["STOP"])
        assert r.choices[0].message.content == "one two "
        chunks = list(_chat(client, "SAY: one two STOP three", stop=["STOP"], stream=True))
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "one two "
    else:
        full = _chat(client, "Count from 1 to 10 separated by commas.", max_tokens=40).choices[0].message.content
        r = _chat(client, "Count from 1 to 10 separated by commas.", max_tokens=40, stop=["5"])
        assert "5" not in r.choices[0].message.content
        assert full.startswith(r.choices[0].message.content)


def test_logprobs(client):
    r = _chat(client, "SAY: abc", logprobs=True, top_logprobs=2, max_tokens=8)
    lp = r.choices[0].logprobs.content
    assert len(lp) == r.usage.completion_tokens
    for item in lp:
        assert item.logprob <= 0.0
        assert len(item.top_logprobs) == 2
        assert item.bytes == list(item.token.encode())


def test_n_two_choices(client):
    r = _chat(client, "SAY: twice", n=2, temperature=0.8, seed=3)
    assert [c.index for c in r.choices] == [0, 1]
    assert all(c.message.content for c in r.choices)
    chunks = list(_chat(client, "SAY: twice", n=2, stream=True))
    assert {c.choices[0].index for c in chunks if c.choices} == {0, 1}


def test_seeded_reproducible(client):
    a = _chat(client, "Tell me a word.", temperature=1.0, seed=1234, max_tokens=16).choices[0].message.content
    b = _chat(client, "Tell me a word.", temperature=1.0, seed=1234, max_tokens=16).choices[0].message.content
    assert a == b


def test_json_schema_output_validates(client, live):
    prompt = 'SAY: {"name": "Ann", "age": 30, "extra": 1}' if live.kind == "fake" else "Give me a person as JSON."
    r = _chat(client, prompt, max_tokens=80,
              response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}})
    obj = json.loads(r.choices[0].message.content)
    assert set(obj) == {"name", "age"}
    assert isinstance(obj["name"], str) and isinstance(obj["age"], int)


def test_json_object_output_parses(client, live):
    prompt = 'SAY: {"ok": [1, 2]} trailing' if live.kind == "fake" else "Reply with a JSON object with one key, color."
    r = _chat(client, prompt, max_tokens=200, response_format={"type": "json_object"})
    assert r.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(r.choices[0].message.content), dict)


@pytest.mark.parametrize("stream", [False, True])
def test_tool_call_round_trip(client, live, stream):
    msgs = [{"role": "user", "content": "What's the weather in Paris?"}]
    kw = dict(model=_model(client), tools=[WEATHER], temperature=0, max_tokens=60,
              tool_choice={"type": "function", "function": {"name": "get_weather"}})
    if stream:
        calls: dict[int, dict] = {}
        finish = None
        for c in client.chat.completions.create(messages=msgs, stream=True, **kw):
            if not c.choices:
                continue
            finish = c.choices[0].finish_reason or finish
            for tc in c.choices[0].delta.tool_calls or []:
                entry = calls.setdefault(tc.index, {"id": None, "name": None, "arguments": ""})
                entry["id"] = tc.id or entry["id"]
                entry["name"] = (tc.function.name if tc.function else None) or entry["name"]
                entry["arguments"] += (tc.function.arguments or "") if tc.function else ""
        assert finish == "tool_calls"
        call = calls[0]
        call_id, name, arguments = call["id"], call["name"], call["arguments"]
    else:
        r = client.chat.completions.create(messages=msgs, **kw)
        assert r.choices[0].finish_reason == "tool_calls"
        tc = r.choices[0].message.tool_calls[0]
        call_id, name, arguments = tc.id, tc.function.name, tc.function.arguments
    assert name == "get_weather" and call_id
    args = json.loads(arguments)
    assert isinstance(args["city"], str)
    msgs += [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}]},
        {"role": "tool", "tool_call_id": call_id, "content": "Sunny, 21 C"},
    ]
    r2 = client.chat.completions.create(model=_model(client), messages=msgs, tools=[WEATHER], max_tokens=30, temperature=0)
    assert r2.choices[0].message.content or r2.choices[0].message.tool_calls
    if live.kind == "fake":
        assert r2.choices[0].message.content == "Tool said: Sunny, 21 C"


@pytest.mark.parametrize("fmt,text", [
    ("hermes", 'Let me check.<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>'),
    ("llama3", '{"name": "get_weather", "parameters": {"city": "Oslo"}}'),
    ("pythonic", '[get_weather(city="Oslo")]'),
])
@pytest.mark.parametrize("stream", [False, True])
def test_auto_tool_parsing_formats(client, live, fmt, text, stream):
    if live.kind != "fake":
        pytest.skip("needs a scripted model output")
    msgs = [{"role": "user", "content": "TOOL: " + text}]
    kw = dict(model=_model(client), messages=msgs, tools=[WEATHER], temperature=0, max_tokens=200)
    if stream:
        args, name, content = "", None, ""
        for c in client.chat.completions.create(stream=True, **kw):
            d = c.choices[0].delta
            content += d.content or ""
            for tc in d.tool_calls or []:
                name = tc.function.name or name
                args += tc.function.arguments or ""
    else:
        m = client.chat.completions.create(**kw).choices[0].message
        name, args, content = m.tool_calls[0].function.name, m.tool_calls[0].function.arguments, m.content or ""
    assert name == "get_weather"
    assert json.loads(args) == {"city": "Oslo"}
    assert content.strip() == ("Let me check." if fmt == "hermes" else "")


def test_legacy_completions(client, live):
    r = client.completions.create(model=_model(client), prompt="SAY: hi" if live.kind == "fake" else "The sky is",
                                  max_tokens=8, temperature=0, logprobs=2)
    assert r.choices[0].text
    assert len(r.choices[0].logprobs.tokens) == r.usage.completion_tokens
    chunks = list(client.completions.create(model=_model(client), prompt="The sky is", max_tokens=8, temperature=0,
                                            stream=True))
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")


def test_alias_accepted(client, live):
    if not live.engine.aliases:
        pytest.skip("engine has no aliases")
    r = client.chat.completions.create(model=live.engine.aliases[0], messages=[{"role": "user", "content": "hi"}],
                                       max_tokens=4)
    assert r.model == live.engine.model_id
