"""Tool-call parsing: whole text and streamed deltas must agree, for every format."""

from __future__ import annotations

import json

import pytest

from augury.server.tool_calls import CallDelta, ContentDelta, StreamingToolParser, parse_tool_calls

CASES = [
    ("hermes", 'Sure.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": [1, 2]}}\n</tool_call>',
     "Sure.\n", [("get_weather", {"city": "Paris", "days": [1, 2]})]),
    ("hermes", '<tool_call>{"name": "a", "arguments": {"s": "}{\\"<tool_call>"}}</tool_call>\n'
               '<tool_call>{"name": "b", "arguments": {}}</tool_call>',
     "", [("a", {"s": '}{"<tool_call>'}), ("b", {})]),
    ("llama3_json", '{"name": "get_weather", "parameters": {"city": "Paris"}}', "", [("get_weather", {"city": "Paris"})]),
    ("llama3_json", '<|python_tag|>{"name": "f", "parameters": {"x": 1}}; {"name": "g", "parameters": {"y": "z"}}', "",
     [("f", {"x": 1}), ("g", {"y": "z"})]),
    ("pythonic", '[get_weather(city="Paris", days=3), now()]', "",
     [("get_weather", {"city": "Paris", "days": 3}), ("now", {})]),
]


@pytest.mark.parametrize("fmt", ["auto", "specific"])
@pytest.mark.parametrize("case", CASES, ids=[c[1][:20] for c in CASES])
def test_whole_text(case, fmt):
    f, text, content, calls = case
    got_content, got = parse_tool_calls(text, f if fmt == "specific" else "auto")
    assert got_content.strip() == content.strip()
    assert [(c.name, json.loads(c.arguments)) for c in got] == calls
    assert len({c.id for c in got}) == len(got)


def _stream(text: str, fmt: str, step: int):
    p = StreamingToolParser(fmt)
    events = []
    for i in range(0, len(text), step):
        events += p.feed(text[i:i + step])
    events += p.finish()
    content = "".join(e.text for e in events if isinstance(e, ContentDelta))
    calls: dict[int, dict] = {}
    for e in events:
        if isinstance(e, CallDelta):
            c = calls.setdefault(e.index, {"name": None, "args": "", "ids": 0})
            if e.id:
                c["ids"] += 1
                c["name"] = e.name
            c["args"] += e.arguments
    return content, calls, events


@pytest.mark.parametrize("step", [1, 3, 7, 1000])
@pytest.mark.parametrize("case", CASES, ids=[c[1][:20] for c in CASES])
def test_streamed_equals_whole(case, step):
    f, text, content, calls = case
    got_content, got, _ = _stream(text, "auto", step)
    assert got_content.strip() == content.strip()
    assert [(c["name"], json.loads(c["args"])) for c in got.values()] == calls
    assert all(c["ids"] == 1 for c in got.values())


def test_arguments_stream_incrementally():
    text = '<tool_call>{"name": "w", "arguments": {"city": "Paris", "note": "long text here"}}</tool_call>'
    _, _, events = _stream(text, "hermes", 1)
    arg_deltas = [e for e in events if isinstance(e, CallDelta) and e.arguments]
    assert len(arg_deltas) > 5  # streamed as it is generated, not in one piece


@pytest.mark.parametrize("text", [
    "Just a plain answer.", "I like <tool_c and <b>bold</b>", '{"answer": 42}', "[1, 2, 3]",
    "[link](http://x)", "  leading space", 'a <tool_call>not json</tool_call> b',
])
def test_plain_text_passes_through(text):
    content, calls = parse_tool_calls(text)
    assert calls == [] and content == text
    got_content, got, _ = _stream(text, "auto", 2)
    assert got == {} and got_content == text


def test_unknown_tool_name_is_text_when_names_given():
    content, calls = parse_tool_calls('{"name": "rm", "parameters": {}}', names={"get_weather"})
    assert calls == [] and content.startswith("{")


def test_content_never_shows_a_partial_marker():
    p = StreamingToolParser("hermes")
    out = p.feed("Hello <tool")
    assert "".join(e.text for e in out if isinstance(e, ContentDelta)) == "Hello "
