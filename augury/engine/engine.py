"""The Engine: public, thread-safe API over an EngineCore running on its own thread.

    engine = Engine.from_model("smollm2")
    result = engine.generate("Hello", SamplingParams(max_tokens=32, temperature=0))
    handle = engine.submit(prompt_ids, params)       # then `for out in handle` or `async for out in handle.stream()`

The single-request path is the engine with one request: there is no second
code path.
"""

from __future__ import annotations

import logging
import queue
import threading
import traceback
import uuid
from typing import Any, Sequence

import torch

from augury.cache.setup import attach_prefix_cache, engine_namespace
from augury.config import EngineConfig
from augury.engine.core import EngineCore
from augury.engine.errors import EngineFull
from augury.engine.handle import RequestHandle
from augury.engine.loader import LoadedModel, load_model
from augury.engine.model_runner import ModelRunner
from augury.engine.request import Request
from augury.engine.sampler import make_generator
from augury.engine.scheduler import Scheduler, SchedulerConfig
from augury.engine.types import GenerationResult, SamplingParams
from augury.kv.block_manager import BlockManager
from augury.kv.pool import KVPool, available_memory_bytes, parse_bytes, plan_groups
from augury.spec.coordinator import DraftPolicy, SpecCoordinator
from augury.spec.factory import build_drafters

log = logging.getLogger("augury")


def kv_budget_bytes(spec: str | None, device: torch.device) -> int:
    """--kv-budget: bytes ('2GiB') or a fraction of free memory ('0.3'). Default: 30% of free memory, at most 1 GiB on CPU."""
    free = available_memory_bytes(device)
    if spec is None:
        if device.type == "cpu":
            return int(min(0.3 * free, 1024**3))
        return int(0.6 * free)
    try:
        val = float(spec)
        if 0 < val <= 1:
            return int(val * free)
    except ValueError:
        pass
    try:
        return parse_bytes(spec)
    except ValueError:
        raise ValueError(f"--kv-budget {spec!r}: give bytes like 2GiB or a fraction like 0.3") from None


class Engine:
    def __init__(self, loaded: LoadedModel, config: EngineConfig):
        self.config = config
        self.loaded = loaded
        self.tokenizer = loaded.tokenizer
        self.model_config = loaded.config
        self.model_id = loaded.name
        self.aliases: list[str] = _registry_aliases(config.model, loaded.name)
        cfg = loaded.config
        max_len = min(config.max_model_len or cfg.max_position_embeddings, cfg.max_position_embeddings)
        budget = kv_budget_bytes(config.kv_budget, loaded.device)
        self.kv_codec = config.kv_codec()
        self.kv_codec.check_head_dim(cfg.head_dim)  # CodecError (a ValueError) names the fix at start-up
        # blocks are sized by the codec's real encoded bytes, so the budget buys more of them
        groups = plan_groups(cfg, loaded.dtype, budget, config.block_size, config.max_num_seqs,
                             config.max_num_batched_tokens, self.kv_codec)
        self.blocks = BlockManager(groups, config.block_size, config.enable_prefix_caching)
        self.pool = KVPool.allocate(cfg, groups, config.block_size, loaded.dtype, loaded.device, self.kv_codec)
        full = next((g for g in groups if g.window is None), groups[0])
        # one request can never use more blocks than its group has
        self.max_model_len = min(max_len, (full.num_blocks - 1) * config.block_size)
        self.cache_namespace = engine_namespace(loaded, config)  # model, tokenizer, KV codec, weights
        self.namespace = self.cache_namespace.key()
        sched_cfg = SchedulerConfig(config.max_num_seqs, config.max_num_batched_tokens, self.max_model_len)
        self.scheduler = Scheduler(sched_cfg, self.blocks, self.namespace)
        self.runner = ModelRunner(loaded.model, cfg, self.pool, self.blocks, loaded.device)
        if loaded.device.type == "cuda" and config.cuda_graphs:
            self.runner.enable_cuda_graphs(loaded.dtype, config.max_num_seqs)
        self.core = EngineCore(self.scheduler, self.runner, self.blocks, loaded.eos_token_ids,
                               self.max_model_len, cfg.vocab_size)
        self.drafters = build_drafters(self, config)
        # RAM budget + SSD tier; wraps drafters with own pools so their KV is cached too
        self.prefix_cache = attach_prefix_cache(self, self.cache_namespace)
        if self.drafters:
            curve = None
            if config.spec_adaptive and config.spec != "off":
                from augury.spec.calibrate import measure_step_costs

                curve = measure_step_costs(loaded.model, self.pool, self.blocks, self.runner.windows, loaded.device)
            self.core.spec = SpecCoordinator(self.drafters, DraftPolicy(
                max_draft=config.num_draft_tokens, adaptive=config.spec_adaptive, curve=curve))
        self._commands: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self._pending = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="augury-engine", daemon=True)
        self._thread.start()

    @classmethod
    def from_random(cls, shape: str = "llama3-8b", **kwargs: Any) -> "Engine":
        """A random-weight model of a named shape (benchmarks; token ids in and out)."""
        from augury.engine.random_model import load_random

        config = EngineConfig(model=f"random:{shape}", **kwargs)
        return cls(load_random(shape, config), config)

    @classmethod
    def from_model(cls, model: str = "smollm2", **kwargs: Any) -> "Engine":
        config = EngineConfig(model=model, **kwargs)
        return cls(load_model(config), config)

    # ---- public API (any thread) -------------------------------------------
    def submit(self, prompt_ids: Sequence[int], params: SamplingParams | None = None,
               request_id: str | None = None) -> RequestHandle:
        params = params or SamplingParams()
        params.validate()
        self._check_kv(params)
        prompt = [int(t) for t in prompt_ids]
        if not prompt:
            raise ValueError("prompt: must contain at least one token")
        vocab = self.model_config.vocab_size
        if any(t < 0 or t >= vocab for t in prompt):
            raise ValueError(f"prompt: token ids must be in [0, {vocab})")
        if len(prompt) >= self.max_model_len:
            raise ValueError(
                f"prompt: {len(prompt)} tokens does not fit the context window of {self.max_model_len} tokens"
            )
        with self._lock:
            if self._pending >= self.config.max_queue + self.config.max_num_seqs:
                raise EngineFull(f"the request queue is full ({self.config.max_queue} waiting)")
            self._pending += 1
        rid = request_id or f"req-{uuid.uuid4().hex[:16]}"
        req = Request(rid, prompt, params)
        if not params.greedy:
            seed = params.seed
            if seed is None and self.config.seed is not None:
                seed = self.config.seed
            req.generator = make_generator(seed)
        if params.logprobs:
            req.logprobs = []
        req.spec_method, req.spec_max_draft = self._spec_for(params)
        try:
            req.detok = self._make_detok(params, prompt)
            if params.structured is not None:
                from augury.structured import make_matcher

                req.matcher = make_matcher(params.structured, self.tokenizer, vocab_size=self.model_config.vocab_size)
        except Exception:
            with self._lock:
                self._pending -= 1
            raise
        handle = RequestHandle(rid, self.abort)
        req.sink = handle
        self._commands.put(("add", req))
        return handle

    def abort(self, request_id: str) -> None:
        self._commands.put(("abort", request_id))

    def _check_kv(self, params: SamplingParams) -> None:
        """A request's `kv_cache` must name the pool's codec: one pool stores one codec today,
        and silently serving another precision would break invariant 6."""
        if params.kv_cache is None:
            return
        from augury.kv.codecs import codec_from_request

        want = codec_from_request(params.kv_cache, self.kv_codec)  # CodecError is a ValueError -> 400
        if want.id != self.kv_codec.id:
            raise ValueError(f"kv_cache: this server stores KV as {self.kv_codec.name} ({self.kv_codec.id}); "
                             f"per-request codecs other than the server's are not supported yet "
                             f"(asked for {want.id}); restart with --kv-quant/--kv-bits to change it")

    def _spec_for(self, params: SamplingParams) -> tuple[str | None, int]:
        """The request's speculative method (None = off) and its draft cap."""
        spec = params.speculative
        if spec is False or spec == "off":
            return None, 0
        method, k = self.config.spec, self.config.num_draft_tokens
        if isinstance(spec, dict):
            method = spec.get("method", method) or "off"
            k = int(spec.get("num_draft_tokens", k))
            if not 0 <= k <= 16:
                raise ValueError("speculative.num_draft_tokens: must be in 0..16")
        elif spec not in (None, True):
            raise ValueError("speculative: must be false or {method, num_draft_tokens}")
        if method == "off" or k == 0:
            return None, 0
        if method not in self.drafters:
            avail = ", ".join(sorted(self.drafters)) or "none"
            raise ValueError(f"speculative.method: {method!r} is not available on this server (available: {avail}; "
                             "draft-model needs --draft-model, layerskip needs --spec layerskip or --spec-layers)")
        if params.structured is not None:
            raise ValueError("speculative: not supported together with structured output yet; "
                             "send speculative: false")
        return method, k

    def generate(self, prompt: str | Sequence[int], params: SamplingParams | None = None) -> GenerationResult:
        """Blocking convenience: a text prompt is tokenized raw (with BOS if the model adds one)."""
        ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        return self.collect(self.submit(ids, params))

    def generate_batch(self, prompts: Sequence[str | Sequence[int]],
                       params: SamplingParams | Sequence[SamplingParams] | None = None) -> list[GenerationResult]:
        """Submit all prompts at once (they share batches), wait for all."""
        plist = params if isinstance(params, (list, tuple)) else [params] * len(prompts)
        handles = [self.submit(self.tokenizer.encode(p) if isinstance(p, str) else list(p),
                               None if pp is None else _copy_params(pp)) for p, pp in zip(prompts, plist)]
        return [self.collect(h) for h in handles]

    @staticmethod
    def collect(handle: RequestHandle) -> GenerationResult:
        text, ids, lps = [], [], []
        last = None
        for out in handle:
            text.append(out.text)
            ids.extend(out.token_ids)
            if out.logprobs:
                lps.extend(out.logprobs)
            last = out
        assert last is not None
        if last.finish_reason == "error":
            raise RuntimeError(f"request {handle.request_id} failed: {last.error}")
        return GenerationResult(handle.request_id, "".join(text), ids, last.finish_reason or "stop",
                                last.prompt_tokens, last.completion_tokens, last.cached_tokens,
                                lps or None, last.speculation, last.ttft_s or 0.0, last.prefill_s or 0.0,
                                last.decode_s or 0.0)

    def stats(self) -> dict[str, Any]:
        c = self.core.counters
        return {
            "num_waiting": len(self.scheduler.waiting),
            "num_running": len(self.scheduler.running),
            # the CUDA-graph scratch block (one per group) is held for the engine's lifetime
            "kv_blocks_total": self.blocks.num_total_blocks() - (len(self.runner.graphs.trash) if self.runner.graphs else 0),
            "kv_blocks_free": self.blocks.num_free_blocks(),
            "kv_block_size": self.blocks.block_size,
            "kv_codec": self.kv_codec.id,
            "prefix_cache_hit_tokens": self.blocks.prefix_hit_tokens,
            "prompt_tokens_total": c.prompt_tokens_total,
            "generation_tokens_total": c.generation_tokens_total,
            "requests_finished": c.requests_finished,
            "requests_aborted": c.requests_aborted,
            "preemptions": c.preemptions,
            "steps": c.steps,
            "spec_drafted_total": self.core.spec.totals["drafted"] if self.core.spec else 0,
            "spec_accepted_total": self.core.spec.totals["accepted"] if self.core.spec else 0,
            "spec_rounds_total": self.core.spec.totals["rounds"] if self.core.spec else 0,
            **self.cache_stats(),
        }

    def cache_stats(self) -> dict[str, Any]:
        """Prefix-cache counters (RAM tier, SSD tier) as flat `prefix_cache_*` keys."""
        if self.prefix_cache is None:
            return {}
        st = self.prefix_cache.stats()
        out = {f"prefix_cache_{k}": v for k, v in st.__dict__.items() if k != "ssd" and v is not None}
        out.update({f"prefix_cache_ssd_{k}": v for k, v in (st.ssd or {}).items()})
        return out

    def flush_cache(self, timeout: float | None = 60.0) -> dict[str, Any]:
        """Wait for pending SSD writes (any thread); returns whether it finished and the counters."""
        done = self.prefix_cache.flush(timeout) if self.prefix_cache is not None else True
        return {"flushed": done, **self.cache_stats()}

    def wait_idle(self, timeout: float = 30.0) -> bool:
        """Block until no request is queued or running (tests, benchmarks)."""
        done = threading.Event()
        self._commands.put(("idle", done))
        return done.wait(timeout)

    def shutdown(self) -> None:
        self._stop.set()
        self._commands.put(("stop", None))
        self._thread.join(timeout=10)
        if self.prefix_cache is not None:
            self.prefix_cache.close()  # finish queued SSD writes

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()

    # ---- engine thread ---------------------------------------------------------
    def _make_detok(self, params: SamplingParams, prompt: list[int]):
        from augury.tokenizer.detokenizer import StreamDetokenizer

        if getattr(self.tokenizer, "is_null", False):
            return None  # random-weight benchmark model: token ids only

        return StreamDetokenizer(self.tokenizer, stop=list(params.stop),
                                 skip_special_tokens=params.skip_special_tokens, prompt_ids=prompt)

    def _handle(self, cmd: str, arg: Any, idle_waiters: list[threading.Event]) -> None:
        if cmd == "add":
            with self._lock:
                self._pending -= 1
            self.core.add(arg)
        elif cmd == "abort":
            self.core.abort(arg)
        elif cmd == "idle":
            idle_waiters.append(arg)

    def _loop(self) -> None:
        idle_waiters: list[threading.Event] = []
        with torch.inference_mode():
            while not self._stop.is_set():
                try:
                    block = not self.core.has_work()
                    while True:
                        cmd, arg = self._commands.get(block=block, timeout=0.5 if block else None) \
                            if block else self._commands.get_nowait()
                        if cmd == "stop":
                            return
                        self._handle(cmd, arg, idle_waiters)
                        block = False
                except queue.Empty:
                    pass
                if not self.core.has_work():
                    for ev in idle_waiters:
                        ev.set()
                    idle_waiters.clear()
                    continue
                try:
                    self.core.step()
                except Exception as e:  # keep serving: fail what was running, log why
                    log.error("engine step failed: %s\n%s", e, traceback.format_exc())
                    self.core.fail_all(f"{type(e).__name__}: {e}")


def _registry_aliases(model: str, model_id: str) -> list[str]:
    """Other names a registered model answers to (the server accepts them as `model`)."""
    from augury.weights.registry import find_entry

    entry = find_entry(str(model))
    if entry is None:
        return []
    return [n for n in (entry.name, *entry.aliases) if n != model_id]


def _copy_params(p: SamplingParams) -> SamplingParams:
    from dataclasses import replace

    return replace(p)
