"""Parse tool calls out of model text, whole or while it streams.

Formats: Hermes/Qwen (`<tool_call>{"name":..,"arguments":{..}}</tool_call>`),
Llama-3 JSON (`{"name":..,"parameters":{..}}`, optional `<|python_tag|>`,
several separated by `;`), and pythonic (`[f(a=1), g(b="x")]`). "auto" picks by
what the text starts with. Arguments are returned as the model's own JSON
text, so streamed argument deltas concatenate to exactly the final string.
"""

from __future__ import annotations

import ast
import json
import re
import uuid
from dataclasses import dataclass, field

FORMATS = ("auto", "hermes", "llama3_json", "pythonic")
OPEN, CLOSE = "<tool_call>", "</tool_call>"
PY_TAG = "<|python_tag|>"
_NAME_RE = re.compile(r'"name"\s*:\s*"((?:[^"\\]|\\.)*)"')
_ARGS_RE = re.compile(r'"(?:arguments|parameters)"\s*:\s*')
_PYTHONIC_HEAD = re.compile(r"^\[\s*[A-Za-z_][\w.]*\s*\(")


@dataclass
class PartialCall:
    name: str | None
    arguments: str  # JSON text seen so far (complete when args_done)
    args_done: bool
    valid: bool = True  # False: a closed body that is not a tool call
    raw: str = ""


@dataclass
class ParseState:
    content: str
    calls: list[PartialCall] = field(default_factory=list)


@dataclass
class ToolCallOut:
    id: str
    name: str
    arguments: str


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


# -- JSON scanning -----------------------------------------------------------------
def _json_value_end(s: str, start: int) -> int:
    """Index just past the JSON value starting at s[start], or -1 if it is not closed yet."""
    i, n = start, len(s)
    if i >= n:
        return -1
    c = s[i]
    if c in "{[":
        depth, in_str, esc = 0, False, False
        while i < n:
            ch = s[i]
            if in_str:
                if esc:
                    esc = False
                elif ch == "\\":
                    esc = True
                elif ch == '"':
                    in_str = False
            elif ch == '"':
                in_str = True
            elif ch in "{[":
                depth += 1
            elif ch in "}]":
                depth -= 1
                if depth == 0:
                    return i + 1
            i += 1
        return -1
    if c == '"':
        esc = False
        for j in range(i + 1, n):
            if esc:
                esc = False
            elif s[j] == "\\":
                esc = True
            elif s[j] == '"':
                return j + 1
        return -1
    m = re.compile(r"-?[\w.+-]+").match(s, i)  # number / true / false / null
    return m.end() if m and m.end() < n else -1


def _scan_call(body: str, closed: bool) -> PartialCall:
    """A (possibly partial) {"name":..,"arguments":..} object."""
    text = body.strip()
    if closed:
        try:
            obj = json.loads(text)
        except json.JSONDecodeError:
            obj = None
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            return PartialCall(None, "", True, valid=False, raw=body)
        args = obj.get("arguments", obj.get("parameters", {}))
        if isinstance(args, str):  # some models emit arguments as a JSON string
            return PartialCall(obj["name"], args, True, raw=body)
        m = _ARGS_RE.search(text)
        raw_args = None
        if m:
            end = _json_value_end(text, m.end())
            raw_args = text[m.end(): end] if end > 0 else None
        if raw_args is None or json.loads(raw_args) != args:
            raw_args = json.dumps(args, ensure_ascii=False)
        return PartialCall(obj["name"], raw_args, True, raw=body)
    nm = _NAME_RE.search(text)
    name = json.loads(f'"{nm.group(1)}"') if nm else None
    m = _ARGS_RE.search(text)
    if not m or m.end() >= len(text):
        return PartialCall(name, "", False, raw=body)
    start = m.end()
    if text[start] not in "{[":
        return PartialCall(name, "", False, raw=body)  # string/scalar args: wait for the whole call
    end = _json_value_end(text, start)
    return PartialCall(name, text[start: end if end > 0 else len(text)], end > 0, raw=body)


def _hold_prefix(seg: str, marker: str) -> str:
    """Drop a suffix of `seg` that could be the start of `marker` (not yet decidable)."""
    for k in range(min(len(marker) - 1, len(seg)), 0, -1):
        if seg.endswith(marker[:k]):
            return seg[:-k]
    return seg


# -- formats -----------------------------------------------------------------------
def _hermes(text: str, final: bool) -> ParseState:
    content: list[str] = []
    calls: list[PartialCall] = []
    pos, first = 0, True
    while True:
        i = text.find(OPEN, pos)
        seg = text[pos: i if i >= 0 else len(text)]
        if i < 0 and not final:
            seg = _hold_prefix(seg, OPEN)
        if first or seg.strip():
            content.append(seg)
        if i < 0:
            break
        first = False
        j = text.find(CLOSE, i + len(OPEN))
        body = text[i + len(OPEN): j if j >= 0 else len(text)]
        call = _scan_call(body, closed=j >= 0 or final)
        if call.valid:
            calls.append(call)
        elif j >= 0 or final:
            content.append(OPEN + body + (CLOSE if j >= 0 else ""))
        if j < 0:
            break
        pos = j + len(CLOSE)
    return ParseState("".join(content), calls)


def _llama3(text: str, final: bool, names: set[str] | None) -> ParseState | None:
    """None when the text is not (or cannot become) Llama-3 JSON calls."""
    s = text.lstrip()
    if s.startswith(PY_TAG):
        s = s[len(PY_TAG):].lstrip()
    elif PY_TAG.startswith(s) and not final:
        return ParseState("")
    if not s:
        return None if final else ParseState("")
    if s[0] != "{":
        return None
    calls: list[PartialCall] = []
    pos = 0
    while pos < len(s):
        end = _json_value_end(s, pos)
        closed = end > 0
        call = _scan_call(s[pos: end if closed else len(s)], closed=closed or final)
        if not call.valid or (closed and not _ARGS_RE.search(s[pos:end])):
            return None
        if call.name is not None and names and call.name not in names:
            return None
        calls.append(call)
        if not closed:
            break
        rest = s[end:]
        stripped = rest.lstrip().lstrip(";").lstrip()
        if not stripped:
            break
        if stripped[0] != "{":
            return None
        pos = len(s) - len(stripped)
    return ParseState("", calls)


def _py_literal(node: ast.AST):
    return ast.literal_eval(node)


def _pythonic(text: str, final: bool, names: set[str] | None) -> ParseState | None:
    s = text.strip()
    if not s.startswith("["):
        return None
    if not _PYTHONIC_HEAD.match(s):
        if final or len(s) > 64 or re.match(r"^\[\s*[A-Za-z_][\w.]*\s*[^\w.(\s]", s):
            return None
        return ParseState("")  # still deciding
    end = _json_value_end(s, 0)
    if end < 0:
        return None if final else ParseState("")
    try:
        tree = ast.parse(s[:end], mode="eval")
    except SyntaxError:
        return None
    if not isinstance(tree.body, ast.List):
        return None
    calls: list[PartialCall] = []
    for node in tree.body.elts:
        if not isinstance(node, ast.Call) or node.args:
            return None
        name = ast.unparse(node.func)
        if names and name not in names:
            return None
        try:
            args = {kw.arg: _py_literal(kw.value) for kw in node.keywords if kw.arg}
        except ValueError:
            return None
        calls.append(PartialCall(name, json.dumps(args, ensure_ascii=False), True))
    return ParseState(s[end:].strip() if final else "", calls)


def parse_partial(text: str, fmt: str = "auto", names: set[str] | None = None, final: bool = False) -> ParseState:
    """Content and calls visible in `text` so far; `final` releases held-back text."""
    if fmt not in FORMATS:
        raise ValueError(f"tool_parser: unknown format {fmt!r}; choose one of {FORMATS}")
    if fmt == "hermes":
        return _hermes(text, final)
    if fmt == "llama3_json":
        return _llama3(text, final, names) or ParseState(text if final else "")
    if fmt == "pythonic":
        return _pythonic(text, final, names) or ParseState(text if final else "")
    for fn in (_llama3, _pythonic):
        st = fn(text, final, names)
        if st is not None:
            return st
    return _hermes(text, final)


def parse_tool_calls(text: str, fmt: str = "auto", names: set[str] | None = None) -> tuple[str, list[ToolCallOut]]:
    """Whole text -> (content, tool calls)."""
    st = parse_partial(text, fmt, names, final=True)
    calls = [ToolCallOut(new_call_id(), c.name, c.arguments or "{}") for c in st.calls if c.name]
    return st.content, calls


# -- streaming -----------------------------------------------------------------------
@dataclass
class ContentDelta:
    text: str


@dataclass
class CallDelta:
    index: int
    id: str | None = None  # set on the first delta of a call
    name: str | None = None
    arguments: str = ""


class StreamingToolParser:
    """Feed text deltas, get content and tool-call deltas (OpenAI streaming shape)."""

    def __init__(self, fmt: str = "auto", names: set[str] | None = None) -> None:
        self.fmt = fmt
        self.names = names
        self.text = ""
        self._content_sent = 0
        self._ids: list[str] = []
        self._args_sent: list[int] = []

    @property
    def num_calls(self) -> int:
        return len(self._ids)

    def feed(self, delta: str) -> list[ContentDelta | CallDelta]:
        self.text += delta
        return self._diff(parse_partial(self.text, self.fmt, self.names, final=False), final=False)

    def finish(self) -> list[ContentDelta | CallDelta]:
        return self._diff(parse_partial(self.text, self.fmt, self.names, final=True), final=True)

    def _diff(self, st: ParseState, final: bool) -> list[ContentDelta | CallDelta]:
        out: list[ContentDelta | CallDelta] = []
        if len(st.content) > self._content_sent:
            out.append(ContentDelta(st.content[self._content_sent:]))
            self._content_sent = len(st.content)
        for k, call in enumerate(st.calls):
            if call.name is None:
                break  # headers go out in order
            if k >= len(self._ids):
                self._ids.append(new_call_id())
                self._args_sent.append(0)
                out.append(CallDelta(k, id=self._ids[k], name=call.name))
            args = call.arguments
            if final and not args and not self._args_sent[k]:
                args = "{}"
            if len(args) > self._args_sent[k]:
                out.append(CallDelta(k, arguments=args[self._args_sent[k]:]))
                self._args_sent[k] = len(args)
        return out
