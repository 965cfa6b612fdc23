"""The official `anthropic` client against a live server."""

from __future__ import annotations

import anthropic
import pytest

WEATHER = {"name": "get_weather", "description": "Current weather for a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 24}},
                            "required": ["city"], "additionalProperties": False}}


@pytest.fixture(scope="module")
def client(live):
    return anthropic.Anthropic(base_url=live.url, api_key="unused", max_retries=0, timeout=120)


def test_messages_plain(client, live):
    r = client.messages.create(model=live.engine.model_id, max_tokens=24, extra_body={"temperature": 0}, system="Be brief.",
                               messages=[{"role": "user", "content": "SAY: Bonjour"}])
    assert r.type == "message" and r.role == "assistant"
    assert r.content[0].type == "text" and r.content[0].text
    assert r.stop_reason in ("end_turn", "max_tokens")
    assert r.usage.input_tokens > 0 and r.usage.output_tokens > 0
    if live.kind == "fake":
        assert r.content[0].text == "Bonjour" and r.stop_reason == "end_turn"


def test_messages_max_tokens_stop_reason(client, live):
    r = client.messages.create(model=live.engine.model_id, max_tokens=2, messages=[{"role": "user", "content": "Hello"}])
    assert r.stop_reason == "max_tokens" and r.usage.output_tokens == 2


def test_messages_stream_event_sequence(client, live):
    prompt = [{"role": "user", "content": [{"type": "text", "text": "SAY: streamed ✓ reply"}]}]
    plain = client.messages.create(model=live.engine.model_id, max_tokens=24, extra_body={"temperature": 0}, messages=prompt)
    kinds, text = [], ""
    with client.messages.stream(model=live.engine.model_id, max_tokens=24, extra_body={"temperature": 0}, messages=prompt) as s:
        for ev in s:
            kinds.append(ev.type)
            if ev.type == "content_block_delta":
                text += ev.delta.text
        final = s.get_final_message()
    core = [k for k in kinds if k in ("message_start", "content_block_start", "content_block_delta",
                                      "content_block_stop", "message_delta", "message_stop")]
    assert core[0] == "message_start" and core[1] == "content_block_start"
    assert core[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert text == plain.content[0].text == final.content[0].text
    assert final.usage.output_tokens == plain.usage.output_tokens


@pytest.mark.parametrize("stream", [False, True])
def test_messages_tool_use_round_trip(client, live, stream):
    kw = dict(model=live.engine.model_id, max_tokens=60, extra_body={"temperature": 0}, tools=[WEATHER],
              tool_choice={"type": "tool", "name": "get_weather"})
    msgs = [{"role": "user", "content": "What's the weather in Paris?"}]
    if stream:
        with client.messages.stream(messages=msgs, **kw) as s:
            for _ in s:
                pass
            r = s.get_final_message()
    else:
        r = client.messages.create(messages=msgs, **kw)
    assert r.stop_reason == "tool_use"
    use = [b for b in r.content if b.type == "tool_use"][0]
    assert use.name == "get_weather" and isinstance(use.input["city"], str)
    msgs += [{"role": "assistant", "content": [{"type": "tool_use", "id": use.id, "name": use.name, "input": use.input}]},
             {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "Sunny, 21 C"}]}]
    r2 = client.messages.create(model=live.engine.model_id, max_tokens=30, extra_body={"temperature": 0}, tools=[WEATHER], messages=msgs)
    assert r2.content
    if live.kind == "fake":
        assert r2.content[0].text == "Tool said: Sunny, 21 C"


def test_messages_auto_tool_parsing(client, live):
    if live.kind != "fake":
        pytest.skip("needs a scripted model output")
    r = client.messages.create(model=live.engine.model_id, max_tokens=200, tools=[WEATHER], messages=[
        {"role": "user", "content": 'TOOL: Checking.<tool_call>{"name": "get_weather", "arguments": {"city": "Rome"}}</tool_call>'}])
    assert [b.type for b in r.content] == ["text", "tool_use"]
    assert r.content[0].text == "Checking." and r.content[1].input == {"city": "Rome"}
