"""A small engine that follows the real Engine contract, for fast server tests.

Tokens are bytes (ids 0..255) plus a few control tokens, so every text round
trips. Output is scripted from the prompt so tests can predict it; structured
requests are driven through the real `augury.structured` matcher. A block
counter stands in for the KV pool so leak tests can count.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import AsyncIterator, Callable

from augury.engine.types import RequestOutput, SamplingParams, TokenLogprob
from augury.server.errors import EngineFull

SPECIALS = ["<|eos|>", "<|im_start|>", "<|im_end|>"]
EOS, IM_START, IM_END = 256, 257, 258
BLOCK = 16


class ByteTokenizer:
    """Byte-level tokenizer with the project tokenizer's API."""

    def __init__(self) -> None:
        self.vocab_size = 256 + len(SPECIALS)
        self.eos_token_ids = [EOS, IM_END]
        self.special_token_ids = [EOS, IM_START, IM_END]
        self.bos_token_id = None

    def id_to_token(self, i: int) -> str:
        if i >= 256:
            return SPECIALS[i - 256]
        return bytes([i]).decode("latin-1")

    def get_vocab(self) -> dict[str, int]:
        # raw vocab: surface strings; bytes >= 0x80 are not valid text alone, map them as latin-1
        return {self.id_to_token(i): i for i in range(self.vocab_size)}

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        out: list[int] = []
        i = 0
        while i < len(text):
            for j, sp in enumerate(SPECIALS):
                if text.startswith(sp, i):
                    out.append(256 + j)
                    i += len(sp)
                    break
            else:
                out.extend(text[i].encode("utf-8"))
                i += 1
        return out

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        buf = bytearray()
        parts: list[str] = []
        for i in ids:
            if i >= 256:
                if not skip_special_tokens:
                    parts.append(buf.decode("utf-8", errors="replace"))
                    buf.clear()
                    parts.append(SPECIALS[i - 256])
                continue
            buf.append(i)
        parts.append(buf.decode("utf-8", errors="replace"))
        return "".join(parts)

    def apply_chat_template(self, messages, tools=None, add_generation_prompt=True) -> str:
        out = []
        if tools:
            out.append(f"<|im_start|>system\nTools: {json.dumps(tools)}<|im_end|>\n")
        for m in messages:
            content = m.get("content") or ""
            if m.get("tool_calls"):
                content += "".join(
                    "<tool_call>" + json.dumps(tc["function"]) + "</tool_call>" for tc in m["tool_calls"]
                )
            out.append(f"<|im_start|>{m['role']}\n{content}<|im_end|>\n")
        if add_generation_prompt:
            out.append("<|im_start|>assistant\n")
        return "".join(out)

    def encode_chat(self, messages, tools=None, add_generation_prompt=True) -> list[int]:
        return self.encode(self.apply_chat_template(messages, tools, add_generation_prompt))


def default_script(prompt: str, params: SamplingParams) -> str:
    """What the fake model 'says'. Directives in the prompt let tests steer it."""
    turns = prompt.split("<|im_start|>")
    if len(turns) >= 2 and turns[-2].startswith("tool\n"):
        return "Tool said: " + turns[-2][5:].split("<|im_end|>", 1)[0]
    for key in ("SAY:", "TOOL:"):
        if key in prompt:
            said = prompt.rsplit(key, 1)[1].split("<|im_end|>", 1)[0].strip()
            if key == "TOOL:":
                return said  # raw tool-call text in some format
            return said
    base = "Hello from the fake engine! Ünïcödé ✓ 🙂 done."
    if params.seed is not None and params.temperature > 0:
        rng = random.Random(params.seed)
        base += " seed-word-" + str(rng.randint(0, 10**6))
    elif params.temperature > 0:
        base += " rnd-" + uuid.uuid4().hex[:6]
    return base


@dataclass
class _Req:
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    out_ids: list[int] = field(default_factory=list)
    cancelled: threading.Event = field(default_factory=threading.Event)
    blocks: int = 0


class FakeHandle:
    def __init__(self, engine: "FakeEngine", req: _Req) -> None:
        self._engine = engine
        self._req = req
        self.request_id = req.request_id

    def cancel(self) -> None:
        self._engine.abort(self.request_id)

    async def stream(self) -> AsyncIterator[RequestOutput]:
        try:
            async for out in self._engine._run(self._req):
                yield out
        finally:
            self._engine._release(self._req)


class FakeEngine:
    def __init__(
        self,
        *,
        max_model_len: int = 2048,
        max_queue: int = 64,
        max_running: int = 8,
        token_delay_s: float = 0.002,
        total_blocks: int = 4096,
        script: Callable[[str, SamplingParams], str] = default_script,
        model_vocab_size: int = 288,  # wider than the tokenizer, like padded real models
    ) -> None:
        self.tokenizer = ByteTokenizer()
        self.model_id = "fake-model"
        self.aliases = ["fake", "gpt-4o-mini"]
        self.max_model_len = max_model_len
        self.vocab_size = model_vocab_size
        self.max_queue = max_queue
        self.token_delay_s = token_delay_s
        self.script = script
        self.total_blocks = total_blocks
        self._lock = threading.Lock()
        self._reqs: dict[str, _Req] = {}
        self._free_blocks = total_blocks
        self._sem = asyncio.Semaphore(max_running)
        self._counts = {"prompt_tokens_total": 0, "generation_tokens_total": 0}
        self.hold = asyncio.Event()  # tests clear it to keep requests waiting
        self.hold.set()
        self.submitted: list[tuple[list[int], SamplingParams]] = []

    # -- contract ---------------------------------------------------------------
    def submit(self, prompt_ids: list[int], params: SamplingParams, request_id: str | None = None):
        params.validate()
        if not prompt_ids:
            raise ValueError("prompt: must not be empty")
        if len(prompt_ids) + params.max_tokens > self.max_model_len:
            raise ValueError(
                f"max_tokens: prompt ({len(prompt_ids)}) + max_tokens ({params.max_tokens}) "
                f"exceeds the context window ({self.max_model_len})"
            )
        matcher = None
        if params.structured is not None:
            from augury.structured import make_matcher

            matcher = make_matcher(params.structured, self.tokenizer, self.vocab_size)
        with self._lock:
            if len(self._reqs) >= self.max_queue:
                raise EngineFull("queue full")
            rid = request_id or f"req-{uuid.uuid4().hex}"
            req = _Req(rid, list(prompt_ids), params)
            req.matcher = matcher  # type: ignore[attr-defined]
            self._reqs[rid] = req
            self._grow(req)
        self.submitted.append((list(prompt_ids), params))
        return FakeHandle(self, req)

    def abort(self, request_id: str) -> None:
        with self._lock:
            req = self._reqs.get(request_id)
        if req is not None:
            req.cancelled.set()

    def stats(self) -> dict:
        with self._lock:
            return {
                "num_waiting": 0,
                "num_running": len(self._reqs),
                "kv_blocks_total": self.total_blocks,
                "kv_blocks_free": self._free_blocks,
                "prefix_cache_hit_tokens": 0,
                **self._counts,
            }

    # -- internals ---------------------------------------------------------------
    def _grow(self, req: _Req) -> None:
        need = -(-(len(req.prompt_ids) + len(req.out_ids) + 1) // BLOCK)
        self._free_blocks -= need - req.blocks
        req.blocks = need

    def _release(self, req: _Req) -> None:
        with self._lock:
            if self._reqs.pop(req.request_id, None) is not None:
                self._free_blocks += req.blocks
                req.blocks = 0

    def _plan(self, req: _Req) -> list[int]:
        text = self.tokenizer.decode(req.prompt_ids, skip_special_tokens=False)
        if req.params.structured is not None:
            return self._structured_plan(req, text)
        ids = self.tokenizer.encode(self.script(text, req.params))
        return ids + ([] if req.params.ignore_eos else [EOS])

    def _structured_plan(self, req: _Req, prompt: str) -> list[int]:
        """Emit the scripted text if the grammar allows it, else the grammar's first choices."""
        m = req.matcher  # type: ignore[attr-defined]
        wanted = self.tokenizer.encode(self.script(prompt, req.params)) + [EOS]
        out: list[int] = []
        for t in wanted:
            if not m.fill_mask()[t]:
                break
            m.accept(t)
            out.append(t)
            if m.is_terminated():
                return out
        # fall back to closing whatever is open: stop, then closers, then the smallest allowed token
        prefer = [EOS, ord('"'), ord("}"), ord("]"), ord("0")]
        while not m.is_terminated() and len(out) < req.params.max_tokens:
            mask = m.fill_mask()
            t = next((c for c in prefer if mask[c]), None)
            t = int(mask.nonzero()[0]) if t is None else t
            m.accept(t)
            out.append(t)
        return out

    async def _run(self, req: _Req) -> AsyncIterator[RequestOutput]:
        p = req.params
        async with self._sem:
            await self.hold.wait()
            plan = self._plan(req)
            t0 = time.monotonic()
            ttft = None
            text_so_far = ""
            emitted = ""
            finish = "length"
            pending: list[int] = []
            pending_lps: list[TokenLogprob] = []
            with self._lock:
                self._counts["prompt_tokens_total"] += len(req.prompt_ids)
            for step, tok in enumerate(itertools.islice(plan, p.max_tokens)):
                await asyncio.sleep(self.token_delay_s)
                if req.cancelled.is_set():
                    yield self._out(req, "", [], None, True, "abort")
                    return
                if tok in self.tokenizer.eos_token_ids and not p.ignore_eos:
                    finish = "stop"
                    break
                req.out_ids.append(tok)
                with self._lock:
                    self._grow(req)
                    self._counts["generation_tokens_total"] += 1
                pending.append(tok)
                if p.logprobs:
                    top = [(tok, -0.1 * (step % 3))] + [((tok + k) % 256, -1.0 - k) for k in range(1, p.top_logprobs)]
                    pending_lps.append(TokenLogprob(tok, -0.1 * (step % 3), top[: p.top_logprobs]))
                full = self.tokenizer.decode(req.out_ids)
                if full.endswith("\ufffd"):
                    continue  # partial UTF-8: hold until complete
                # stop strings: cut at the first one and never leak a prefix of one
                cut = min((full.find(s) for s in p.stop if s and s in full), default=-1)
                if cut >= 0:
                    delta = full[len(emitted):cut]
                    emitted = full[:cut]
                    yield self._out(req, delta, pending, pending_lps, False, None)
                    finish = "stop"
                    pending, pending_lps = [], []
                    break
                hold = max((k for s in p.stop for k in range(1, len(s)) if full.endswith(s[:k])), default=0)
                safe = full[: len(full) - hold]
                delta = safe[len(emitted):]
                emitted = safe
                if ttft is None:
                    ttft = time.monotonic() - t0
                yield self._out(req, delta, pending, pending_lps if p.logprobs else None, False, None)
                pending, pending_lps = [], []
            else:
                finish = "length"  # ran out of max_tokens (or of script without an eos)
            text_so_far = self.tokenizer.decode(req.out_ids)
            tail = "" if finish == "stop" and p.stop and any(s in text_so_far for s in p.stop) else text_so_far[len(emitted):]
            final = self._out(req, tail, pending, pending_lps if p.logprobs else None, True, finish)
            final.ttft_s = ttft or 0.0
            final.decode_s = time.monotonic() - t0
            yield final

    def _out(self, req, text, ids, lps, finished, reason) -> RequestOutput:
        return RequestOutput(
            request_id=req.request_id,
            text=text,
            token_ids=list(ids),
            logprobs=list(lps) if lps else ([] if req.params.logprobs else None),
            finished=finished,
            finish_reason=reason,
            prompt_tokens=len(req.prompt_ids),
            completion_tokens=len(req.out_ids),
            cached_tokens=0,
        )
