"""Wire requests -> (prompt token ids, SamplingParams), shared by both APIs.

Everything that can be checked before the engine sees the request is checked
here and raised as an `APIError` naming the field.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

from augury.engine.types import SamplingParams
from augury.server.errors import APIError, bad_request

MAX_STOPS = 16


def resolve_model(engine: Any, name: str | None) -> str:
    """The loaded id or an alias; anything else is a 404 model_not_found."""
    if not name or name == engine.model_id or name in getattr(engine, "aliases", ()):
        return engine.model_id
    raise APIError(404, f"The model '{name}' does not exist; this server serves '{engine.model_id}'",
                   param="model", code="model_not_found")


def text_of(content: Any, field: str) -> str:
    """String or list of text parts -> one string; other part types are refused by name."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    out = []
    for i, part in enumerate(content):
        ptype = getattr(part, "type", None)
        text = getattr(part, "text", None)
        if ptype not in ("text", "input_text") or text is None:
            raise bad_request(f"{field}[{i}].type: only text content is supported, got {ptype!r}",
                              param=f"{field}[{i}].type")
        out.append(text)
    return "".join(out)


def stop_list(stop: str | list[str] | None, field: str = "stop") -> list[str]:
    if stop is None:
        return []
    items = [stop] if isinstance(stop, str) else list(stop)
    if len(items) > MAX_STOPS:
        raise bad_request(f"{field}: at most {MAX_STOPS} stop sequences", param=field)
    return [s for s in items if s]


def logit_bias_ids(bias: dict[str, float] | None, vocab_size: int) -> dict[int, float]:
    out: dict[int, float] = {}
    for k, v in (bias or {}).items():
        try:
            tid = int(k)
        except ValueError:
            raise bad_request(f"logit_bias: key {k!r} is not a token id", param="logit_bias") from None
        if not 0 <= tid < vocab_size:
            raise bad_request(f"logit_bias: token id {tid} is outside the vocabulary [0, {vocab_size})",
                              param="logit_bias")
        if not -100.0 <= v <= 100.0:
            raise bad_request(f"logit_bias: value for {tid} must be in [-100, 100]", param="logit_bias")
        out[tid] = float(v)
    return out


def resolve_max_tokens(engine: Any, prompt_len: int, requested: int | None, default_cap: int | None,
                       field: str = "max_tokens") -> int:
    """Check prompt + max_tokens against the context window (400 with both numbers)."""
    ctx = int(engine.max_model_len)
    if prompt_len >= ctx:
        raise APIError(400, f"the prompt has {prompt_len} tokens but the model's context window is {ctx} tokens",
                       param="messages", code="context_length_exceeded")
    if requested is None:
        room = ctx - prompt_len
        return min(room, default_cap) if default_cap else room
    if prompt_len + requested > ctx:
        raise APIError(
            400,
            f"{field}: the prompt ({prompt_len} tokens) plus {field} ({requested}) is "
            f"{prompt_len + requested} tokens, more than the model's context window of {ctx} tokens",
            param=field, code="context_length_exceeded",
        )
    return requested


def choice_params(base: SamplingParams, n: int) -> list[SamplingParams]:
    """n choices: distinct but reproducible seeds when a seed is given."""
    if n == 1:
        return [base]
    return [replace(base, seed=None if base.seed is None else base.seed + i, stop=list(base.stop)) for i in range(n)]


def speculation_usage(finals) -> dict | None:
    """usage.speculation: the request's own counters (n > 1: summed over the choices)."""
    specs = [f.speculation for f in finals if getattr(f, "speculation", None)]
    if not specs:
        return None
    if len(specs) == 1:
        return specs[0]
    out = {"method": specs[0]["method"]}
    for k in ("drafted", "accepted", "rounds"):
        out[k] = sum(s[k] for s in specs)
    out["acceptance_rate"] = out["accepted"] / out["drafted"] if out["drafted"] else 0.0
    out["mean_accepted_length"] = (out["accepted"] + out["rounds"]) / out["rounds"] if out["rounds"] else 0.0
    n = max(len(s["accepted_by_position"]) for s in specs)
    out["accepted_by_position"] = [sum(s["accepted_by_position"][i] for s in specs
                                       if i < len(s["accepted_by_position"])) for i in range(n)]
    return out


def validated(params: SamplingParams) -> SamplingParams:
    try:
        params.validate()
    except ValueError as e:
        from augury.server.errors import from_value_error

        raise from_value_error(e) from e
    return params


# -- tools ---------------------------------------------------------------------------
@dataclass
class ToolSpec:
    name: str
    description: str | None
    parameters: dict


def template_tools(tools: list[ToolSpec]) -> list[dict] | None:
    """HF chat-template shape."""
    if not tools:
        return None
    return [
        {"type": "function", "function": {"name": t.name, "description": t.description or "",
                                          "parameters": t.parameters or {"type": "object", "properties": {}}}}
        for t in tools
    ]


def forced_tool_spec(tools: list[ToolSpec], name: str | None) -> dict:
    """Structured spec making the output one JSON call {"name":..,"arguments":{..}}:
    of the named tool, or of any tool ("required")."""

    def one(t: ToolSpec) -> dict:
        return {
            "type": "object",
            "properties": {"name": {"const": t.name}, "arguments": t.parameters or {"type": "object"}},
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }

    if name is not None:
        match = [t for t in tools if t.name == name]
        if not match:
            raise bad_request(f"tool_choice: no tool named {name!r} in tools", param="tool_choice")
        schema = one(match[0])
    else:
        schema = one(tools[0]) if len(tools) == 1 else {"anyOf": [one(t) for t in tools]}
    return {"type": "json_schema", "schema": schema, "strict": True, "any_whitespace": False}


def parse_arguments(arguments: str) -> Any:
    """Assistant tool-call arguments for the template: a dict when they are JSON."""
    try:
        return json.loads(arguments)
    except (json.JSONDecodeError, TypeError):
        return arguments
