"""OpenAI routes: /v1/chat/completions, /v1/completions, /v1/models."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from augury.engine.types import RequestOutput, SamplingParams, TokenLogprob
from augury.server import convert
from augury.server.convert import speculation_usage
from augury.server.errors import APIError, bad_request, openai_body
from augury.server.schemas_openai import ChatCompletionRequest, CompletionRequest, SamplingFields
from augury.server.sse import SSE_HEADERS, data_event
from augury.server.streaming import DisconnectAwareStream, collect_unless_disconnected, merge, submit_all, final_or_500
from augury.server.tool_calls import CallDelta, ContentDelta, StreamingToolParser, parse_tool_calls

router = APIRouter()


def _state(request: Request):
    return request.app.state.engine, request.app.state.config, request.app.state.metrics


def _finish(reason: str | None, has_calls: bool = False) -> str:
    if has_calls:
        return "tool_calls"
    return "length" if reason == "length" else "stop"


def _usage(finals: list[RequestOutput]) -> dict:
    prompt = finals[0].prompt_tokens if finals else 0
    completion = sum(o.completion_tokens for o in finals)
    cached = finals[0].cached_tokens if finals else 0
    usage = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
             "prompt_tokens_details": {"cached_tokens": cached}}
    spec = speculation_usage(finals)
    if spec is not None:
        usage["speculation"] = spec
    kv = next((o.kv_cache for o in finals if getattr(o, "kv_cache", None)), None)
    if kv is not None:
        usage["kv_cache"] = kv  # codec, start, the native/encoded boundary reached, sliding layers' codec
    return usage


def _sampling(req: SamplingFields, engine: Any, max_tokens: int) -> SamplingParams:
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=1.0 if req.temperature is None else req.temperature,
        top_k=0 if req.top_k in (None, -1) else req.top_k,
        top_p=1.0 if req.top_p is None else req.top_p,
        min_p=req.min_p or 0.0,
        repetition_penalty=req.repetition_penalty or 1.0,
        presence_penalty=req.presence_penalty or 0.0,
        frequency_penalty=req.frequency_penalty or 0.0,
        logit_bias=convert.logit_bias_ids(req.logit_bias, _vocab_size(engine)),
        seed=req.seed,
        stop=convert.stop_list(req.stop),
        ignore_eos=req.ignore_eos,
        speculative=req.speculative_param(),
        kv_cache=req.kv_cache_param(),
    )


def _vocab_size(engine: Any) -> int:
    return int(getattr(engine, "vocab_size", None) or engine.tokenizer.vocab_size)


class _TokenText:
    """Token id -> its text for logprobs, memoized per request."""

    def __init__(self, tokenizer: Any) -> None:
        self.tok = tokenizer
        self.cache: dict[int, str] = {}

    def __call__(self, tid: int) -> str:
        s = self.cache.get(tid)
        if s is None:
            s = self.cache[tid] = self.tok.decode([tid], skip_special_tokens=False)
        return s


def _chat_logprobs(lps: list[TokenLogprob], text: _TokenText) -> list[dict]:
    out = []
    for lp in lps:
        t = text(lp.token_id)
        out.append({
            "token": t, "logprob": lp.logprob, "bytes": list(t.encode("utf-8")),
            "top_logprobs": [{"token": text(i), "logprob": v, "bytes": list(text(i).encode("utf-8"))} for i, v in lp.top],
        })
    return out


# -- chat ------------------------------------------------------------------------------------
def _chat_messages(req: ChatCompletionRequest) -> list[dict]:
    names_by_id: dict[str, str] = {}
    out: list[dict] = []
    for i, m in enumerate(req.messages):
        text = convert.text_of(m.content, f"messages[{i}].content")
        role = "system" if m.role == "developer" else m.role
        msg: dict[str, Any] = {"role": role, "content": text}
        if m.role == "assistant" and m.tool_calls:
            msg["tool_calls"] = []
            for tc in m.tool_calls:
                if tc.id:
                    names_by_id[tc.id] = tc.function.name
                msg["tool_calls"].append({"id": tc.id, "type": "function", "function": {
                    "name": tc.function.name, "arguments": convert.parse_arguments(tc.function.arguments)}})
        if m.role == "tool":
            if not m.tool_call_id:
                raise bad_request(f"messages[{i}].tool_call_id: required for role 'tool'", param=f"messages[{i}].tool_call_id")
            msg["tool_call_id"] = m.tool_call_id
            msg["name"] = m.name or names_by_id.get(m.tool_call_id, "")
        elif m.name:
            msg["name"] = m.name
        out.append(msg)
    return out


def _chat_tools(req: ChatCompletionRequest) -> tuple[list[convert.ToolSpec], str, str | None]:
    """-> (tools, mode: none|parse|forced, forced tool name)."""
    tools = [convert.ToolSpec(t.function.name, t.function.description, t.function.parameters or {}) for t in req.tools or []]
    choice = req.tool_choice
    if choice is None:
        choice = "auto" if tools else "none"
    if not tools:
        if choice in ("required",) or not isinstance(choice, str):
            raise bad_request("tool_choice: needs a non-empty 'tools' list", param="tool_choice")
        return tools, "none", None
    if choice == "none":
        return tools, "none", None
    if choice == "auto":
        return tools, "parse", None
    if choice == "required":
        return tools, "forced", None
    return tools, "forced", choice.function.name


def _response_format_spec(req: ChatCompletionRequest) -> dict | None:
    rf = req.response_format
    if rf is None or rf.type == "text":
        return None
    if rf.type == "json_object":
        return {"type": "json_object"}
    if rf.json_schema is None:
        raise bad_request("response_format.json_schema: required when type is 'json_schema'",
                          param="response_format.json_schema")
    strict = True if rf.json_schema.strict is None else rf.json_schema.strict
    return {"type": "json_schema", "schema": rf.json_schema.schema_, "strict": strict}


async def _encode(fn, *args, **kw) -> list[int]:
    try:
        return await asyncio.to_thread(fn, *args, **kw)
    except APIError:
        raise
    except Exception as e:  # template errors (e.g. role order the template refuses)
        raise bad_request(f"messages: the chat template could not render these messages: {e}", param="messages") from e


@router.post("/v1/chat/completions")
async def chat_completions(body: ChatCompletionRequest, request: Request):
    t0 = time.monotonic()
    engine, cfg, metrics = _state(request)
    model = convert.resolve_model(engine, body.model)
    messages = _chat_messages(body)
    tools, tool_mode, forced_name = _chat_tools(body)
    structured = _response_format_spec(body)
    if tool_mode == "forced":
        if structured is not None:
            raise bad_request("response_format: cannot be combined with tool_choice 'required' or a named tool",
                              param="response_format")
        structured = convert.forced_tool_spec(tools, forced_name)
    if tool_mode == "parse" and cfg.tool_parser == "none":
        tool_mode = "none"
    prompt_ids = await _encode(engine.tokenizer.encode_chat, messages, tools=convert.template_tools(tools),
                               add_generation_prompt=True)
    requested = body.max_completion_tokens or body.max_tokens
    field = "max_completion_tokens" if body.max_completion_tokens else "max_tokens"
    max_tokens = convert.resolve_max_tokens(engine, len(prompt_ids), requested, cfg.default_max_tokens, field)
    base = _sampling(body, engine, max_tokens)
    base.logprobs = body.logprobs
    base.top_logprobs = body.top_logprobs or 0
    if body.top_logprobs and not body.logprobs:
        raise bad_request("top_logprobs: requires logprobs=true", param="top_logprobs")
    base.structured = structured
    convert.validated(base)
    params = convert.choice_params(base, body.n)
    handles = await asyncio.to_thread(submit_all, engine, [(prompt_ids, p) for p in params], cfg.retry_after_s)

    rid = "chatcmpl-" + uuid.uuid4().hex
    created = int(time.time())
    fmt = "llama3_json" if tool_mode == "forced" else cfg.tool_parser
    names = {t.name for t in tools}
    token_text = _TokenText(engine.tokenizer)
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        gen = _chat_stream(handles, metrics, t0, rid, created, model, tool_mode, fmt, names, token_text, include_usage)
        return DisconnectAwareStream(gen, media_type="text/event-stream", headers=SSE_HEADERS)

    outs = await collect_unless_disconnected(request, handles, metrics, t0)
    choices, finals = [], []
    for i, seq in enumerate(outs):
        final = final_or_500(seq)
        finals.append(final)
        text = "".join(o.text for o in seq)
        message: dict[str, Any] = {"role": "assistant", "content": text}
        calls = []
        if tool_mode != "none":
            content, calls = parse_tool_calls(text, fmt, names)
            if calls:
                message["content"] = content.strip() or None
                message["tool_calls"] = [{"id": c.id, "type": "function",
                                          "function": {"name": c.name, "arguments": c.arguments}} for c in calls]
        lps = None
        if body.logprobs:
            lps = {"content": _chat_logprobs([lp for o in seq for lp in (o.logprobs or [])], token_text)}
        choices.append({"index": i, "message": message, "logprobs": lps,
                        "finish_reason": _finish(final.finish_reason, bool(calls))})
    return JSONResponse({"id": rid, "object": "chat.completion", "created": created, "model": model,
                         "system_fingerprint": None, "choices": choices, "usage": _usage(finals)})


async def _chat_stream(handles, metrics, t0, rid, created, model, tool_mode, fmt, names, token_text, include_usage):
    n = len(handles)

    def chunk(i: int | None, delta: dict | None = None, finish: str | None = None, logprobs=None, usage=None) -> bytes:
        choices = [] if i is None else [{"index": i, "delta": delta or {}, "logprobs": logprobs, "finish_reason": finish}]
        body = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
                "system_fingerprint": None, "choices": choices}
        if include_usage:
            body["usage"] = usage
        return data_event(body)

    parsers = [StreamingToolParser(fmt, names) if tool_mode != "none" else None for _ in range(n)]
    finals: list[RequestOutput | None] = [None] * n
    try:
        for i in range(n):
            yield chunk(i, {"role": "assistant", "content": ""})
        async for i, out in merge(handles, metrics, t0):
            if out.error or out.finish_reason == "error":
                raise APIError(500, f"generation failed: {out.error or 'engine error'}")
            lps = {"content": _chat_logprobs(out.logprobs, token_text)} if out.logprobs else None
            parser = parsers[i]
            if parser is None:
                if out.text or lps:
                    yield chunk(i, {"content": out.text}, logprobs=lps)
            else:
                events = parser.feed(out.text) + (parser.finish() if out.finished else [])
                for ev in events:
                    if isinstance(ev, ContentDelta):
                        yield chunk(i, {"content": ev.text}, logprobs=lps)
                    else:
                        yield chunk(i, {"tool_calls": [_call_delta(ev)]}, logprobs=lps)
                    lps = None
            if out.finished:
                finals[i] = out
                has_calls = parser is not None and parser.num_calls > 0
                yield chunk(i, {}, finish=_finish(out.finish_reason, has_calls))
        if include_usage:
            yield chunk(None, usage=_usage([f for f in finals if f is not None]))
    except APIError as e:
        yield data_event(openai_body(e))
    yield data_event("[DONE]")


def _call_delta(ev: CallDelta) -> dict:
    d: dict[str, Any] = {"index": ev.index}
    if ev.id is not None:
        d.update({"id": ev.id, "type": "function", "function": {"name": ev.name, "arguments": ""}})
    else:
        d["function"] = {"arguments": ev.arguments}
    return d


# -- legacy completions ------------------------------------------------------------------------
def _completion_prompts(body: CompletionRequest, tokenizer: Any) -> list[list[int] | str]:
    p = body.prompt
    if isinstance(p, str):
        return [p]
    if not p:
        raise bad_request("prompt: must not be empty", param="prompt")
    if all(isinstance(x, int) for x in p):
        return [list(p)]  # type: ignore[arg-type]
    if all(isinstance(x, str) for x in p):
        return list(p)  # type: ignore[arg-type]
    return [list(x) for x in p]  # type: ignore[union-attr]


def _completion_logprobs(lps: list[TokenLogprob], text: _TokenText, offset: int) -> dict:
    tokens, token_lps, tops, offsets = [], [], [], []
    for lp in lps:
        t = text(lp.token_id)
        tokens.append(t)
        token_lps.append(lp.logprob)
        tops.append({text(i): v for i, v in lp.top})
        offsets.append(offset)
        offset += len(t)
    return {"tokens": tokens, "token_logprobs": token_lps, "top_logprobs": tops, "text_offset": offsets}


@router.post("/v1/completions")
async def completions(body: CompletionRequest, request: Request):
    t0 = time.monotonic()
    engine, cfg, metrics = _state(request)
    model = convert.resolve_model(engine, body.model)
    vocab = _vocab_size(engine)
    work: list[tuple[list[int], SamplingParams]] = []
    for p in _completion_prompts(body, engine.tokenizer):
        ids = await _encode(engine.tokenizer.encode, p, add_special_tokens=True) if isinstance(p, str) else p
        if not ids:
            raise bad_request("prompt: must not be empty", param="prompt")
        if any(not 0 <= t < vocab for t in ids):
            raise bad_request(f"prompt: token ids must be in [0, {vocab})", param="prompt")
        # OpenAI's legacy default is 16 new tokens
        requested = 16 if body.max_tokens is None else body.max_tokens
        max_tokens = convert.resolve_max_tokens(engine, len(ids), requested, cfg.default_max_tokens)
        base = _sampling(body, engine, max_tokens)
        if body.logprobs is not None:
            base.logprobs, base.top_logprobs = True, body.logprobs
        convert.validated(base)
        work.extend((ids, sp) for sp in convert.choice_params(base, body.n))
    handles = await asyncio.to_thread(submit_all, engine, work, cfg.retry_after_s)
    rid = "cmpl-" + uuid.uuid4().hex
    created = int(time.time())
    token_text = _TokenText(engine.tokenizer)
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return DisconnectAwareStream(
            _completion_stream(handles, metrics, t0, rid, created, model, token_text, include_usage, body.n),
            media_type="text/event-stream", headers=SSE_HEADERS)
    outs = await collect_unless_disconnected(request, handles, metrics, t0)
    choices, finals = [], []
    for i, seq in enumerate(outs):
        final = final_or_500(seq)
        finals.append(final)
        lps = None
        if body.logprobs is not None:
            lps = _completion_logprobs([lp for o in seq for lp in (o.logprobs or [])], token_text, 0)
        choices.append({"index": i, "text": "".join(o.text for o in seq), "logprobs": lps,
                        "finish_reason": _finish(final.finish_reason)})
    usage = _usage(finals)
    usage["prompt_tokens"] = sum(f.prompt_tokens for k, f in enumerate(finals) if k % body.n == 0)
    usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
    return JSONResponse({"id": rid, "object": "text_completion", "created": created, "model": model,
                         "choices": choices, "usage": usage})


async def _completion_stream(handles, metrics, t0, rid, created, model, token_text, include_usage, n):
    finals: dict[int, RequestOutput] = {}
    offsets = [0] * len(handles)

    def chunk(choices: list, usage=None) -> bytes:
        body = {"id": rid, "object": "text_completion", "created": created, "model": model, "choices": choices}
        if include_usage:
            body["usage"] = usage
        return data_event(body)

    try:
        async for i, out in merge(handles, metrics, t0):
            if out.error or out.finish_reason == "error":
                raise APIError(500, f"generation failed: {out.error or 'engine error'}")
            lps = _completion_logprobs(out.logprobs, token_text, offsets[i]) if out.logprobs else None
            offsets[i] += len(out.text)
            if out.text or lps or out.finished:
                finish = _finish(out.finish_reason) if out.finished else None
                yield chunk([{"index": i, "text": out.text, "logprobs": lps, "finish_reason": finish}])
            if out.finished:
                finals[i] = out
        if include_usage:
            fl = [finals[k] for k in sorted(finals)]
            usage = _usage(fl)
            usage["prompt_tokens"] = sum(f.prompt_tokens for k, f in finals.items() if k % n == 0)
            usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
            yield chunk([], usage)
    except APIError as e:
        yield data_event(openai_body(e))
    yield data_event("[DONE]")


# -- models ---------------------------------------------------------------------------------------
def _model_card(engine: Any, created: int) -> dict:
    return {"id": engine.model_id, "object": "model", "created": created, "owned_by": "augury",
            "max_model_len": engine.max_model_len, "aliases": list(getattr(engine, "aliases", []))}


@router.get("/v1/models")
async def list_models(request: Request):
    engine = request.app.state.engine
    return {"object": "list", "data": [_model_card(engine, request.app.state.started)]}


@router.get("/v1/models/{model_id:path}")
async def get_model(model_id: str, request: Request):
    engine = request.app.state.engine
    convert.resolve_model(engine, model_id)
    return _model_card(engine, request.app.state.started)
