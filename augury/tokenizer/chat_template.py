"""Render chat templates (jinja2) with Hugging Face's semantics.

Templates come from model files, i.e. untrusted code: they run in jinja2's immutable sandbox,
with the same environment options, globals and filters transformers gives them, so a template
renders here exactly as `tokenizer.apply_chat_template(..., tokenize=False)` renders it.
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.utils
from jinja2.sandbox import ImmutableSandboxedEnvironment


class ChatTemplateError(ValueError):
    """The chat could not be rendered (bad messages, or the template raised); maps to a 4xx."""


class NoChatTemplateError(ChatTemplateError):
    """The model ships no chat template and none is known for its architecture."""


class _GenerationTag(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` marks assistant text for training masks; we only render it."""

    tags = {"generation"}

    def parse(self, parser: Any) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller: Any) -> str:
        return caller()


class _SafeNamespace(jinja2.utils.Namespace):
    """`namespace()` that refuses dunder/underscore attributes, closing a sandbox escape route."""

    def __init__(*args: Any, **kwargs: Any) -> None:
        self, rest = args[0], args[1:]
        attrs = dict(*rest, **kwargs)
        for name in attrs:
            _SafeNamespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _SafeNamespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"chat templates cannot set namespace attribute {name!r}")


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    # jinja's own tojson HTML-escapes and sorts keys; HF's keeps text as-is, which templates expect
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=32)
def compile_template(source: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["namespace"] = _SafeNamespace
    try:
        return env.from_string(source)
    except jinja2.exceptions.TemplateSyntaxError as e:
        raise ChatTemplateError(f"the model's chat template does not compile: {e}") from e


# Signs that a template walks a message's content as a list of typed parts (multimodal-aware).
_PARTS_AWARE = re.compile(
    r"content\s+is\s+(not\s+)?(string|iterable|sequence|mapping)"
    r"|content\s*\[\s*0\s*\]"
    r"|for\s+\w+\s+in\s+[\w.\[\]'\"]*content\b"
    r"|\[\s*['\"]type['\"]\s*\]|\.type\s*==",
)


def template_reads_content_parts(source: str) -> bool:
    return _PARTS_AWARE.search(source) is not None


def join_text_parts(content: Any) -> Any:
    """OpenAI-style `[{"type": "text", "text": ...}, ...]` -> one string (other parts are refused)."""
    if not isinstance(content, list):
        return content
    texts = []
    for part in content:
        if isinstance(part, str):
            texts.append(part)
        elif isinstance(part, dict) and part.get("type", "text") == "text" and isinstance(part.get("text"), str):
            texts.append(part["text"])
        else:
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise ChatTemplateError(f"message content part of type {kind!r} is not supported by this model")
    return "\n".join(texts)


_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


def normalize_messages(messages: list[dict[str, Any]], parts_aware: bool) -> list[dict[str, Any]]:
    """Plain dicts as HF hands them to templates: None-valued keys dropped (templates test for
    presence), reasoning aliased under the names templates read, text parts joined if needed."""
    out = []
    for m in messages:
        if hasattr(m, "model_dump"):
            m = m.model_dump()
        if not isinstance(m, dict):
            raise ChatTemplateError(f"chat messages must be objects with 'role' and 'content', got {m!r}")
        msg = {k: v for k, v in m.items() if v is not None}
        reasoning = next((msg[k] for k in _REASONING_FIELDS if msg.get(k) is not None), None)
        if reasoning is not None:
            msg = {"thinking": reasoning, **msg, "reasoning_content": reasoning}
        if not parts_aware and isinstance(msg.get("content"), list):
            msg["content"] = join_text_parts(msg["content"])
        out.append(msg)
    return out


def render_chat(
    source: str,
    messages: list[dict[str, Any]],
    *,
    tools: list[dict[str, Any]] | None = None,
    add_generation_prompt: bool = True,
    special_tokens: dict[str, str | None] | None = None,
    **kwargs: Any,
) -> str:
    """The prompt text for `messages` under template `source` (special tokens as variables)."""
    template = compile_template(source)
    if tools is not None and not all(isinstance(t, dict) for t in tools):
        raise ChatTemplateError("tools must be JSON-schema objects")
    msgs = normalize_messages(list(messages), template_reads_content_parts(source))
    variables = dict(special_tokens or {})
    variables.update(kwargs)
    try:
        return template.render(
            messages=msgs, tools=tools, add_generation_prompt=add_generation_prompt, **variables
        )
    except jinja2.exceptions.TemplateError as e:
        raise ChatTemplateError(f"chat template error: {e}") from e
    except (TypeError, KeyError, AttributeError, IndexError) as e:
        raise ChatTemplateError(f"chat template could not render these messages: {e}") from e


# Gemma 3's instruction format, for GGUF files that dropped the template: a system message is
# folded into the first user turn, "assistant" is spelled "model", and turns must alternate.
GEMMA3_TEMPLATE = """{{- bos_token -}}
{%- if messages and messages[0]['role'] == 'system' -%}
  {%- if messages[0]['content'] is string -%}
    {%- set first_prefix = messages[0]['content'] + '\n\n' -%}
  {%- else -%}
    {%- set first_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}
  {%- endif -%}
  {%- set turns = messages[1:] -%}
{%- else -%}
  {%- set first_prefix = '' -%}
  {%- set turns = messages -%}
{%- endif -%}
{%- for message in turns -%}
  {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
    {{- raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') -}}
  {%- endif -%}
  {%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}
  {{- '<start_of_turn>' + role + '\n' + (first_prefix if loop.first else '') -}}
  {%- if message['content'] is string -%}
    {{- message['content'] | trim -}}
  {%- else -%}
    {%- for part in message['content'] -%}
      {%- if part['type'] == 'image' -%}
        {{- '<start_of_image>' -}}
      {%- elif part['type'] == 'text' -%}
        {{- part['text'] | trim -}}
      {%- endif -%}
    {%- endfor -%}
  {%- endif -%}
  {{- '<end_of_turn>\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
  {{- '<start_of_turn>model\n' -}}
{%- endif -%}
"""

# Templates shipped for architectures whose GGUF files commonly omit theirs.
FALLBACK_TEMPLATES: dict[str, str] = {"gemma3": GEMMA3_TEMPLATE, "gemma3_text": GEMMA3_TEMPLATE}
