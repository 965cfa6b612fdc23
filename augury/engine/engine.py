"""The Engine: public, thread-safe API over an EngineCore running on its own thread.

    engine = Engine.from_model("smollm2")
    result = engine.generate("Hello", SamplingParams(max_tokens=32, temperature=0))
    handle = engine.submit(prompt_ids, params)       # then `for out in handle` or `async for out in handle.stream()`

The single-request path is the engine with one request: there is no second
code path.
"""

from __future__ import annotations

import logging
import os
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
from augury.engine.threads import run_in_fresh_thread
from augury.engine.scheduler import Scheduler, SchedulerConfig
from augury.engine.types import GenerationResult, SamplingParams
from augury.kv.block_manager import BlockClasses, BlockManager, KVGroup
from augury.kv.pool import KVPool, available_memory_bytes, base_codec, class_name, parse_bytes, plan_class_groups, plan_groups
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
        # storage classes: the default codec's, native when it starts late, and --kv-extra-codecs
        self.kv_classes = self._storage_classes(config, cfg.head_dim)  # CodecError names the fix at start-up
        # blocks are sized by each codec's real encoded bytes, so the budget buys more of them
        if len(self.kv_classes) == 1:
            groups = [KVGroup(g.name, g.num_blocks, g.window, ((class_name(self.kv_codec), g.num_blocks),))
                      for g in plan_groups(cfg, loaded.dtype, budget, config.block_size, config.max_num_seqs,
                                           config.max_num_batched_tokens, self.kv_codec)]
        else:
            names = list(self.kv_classes)
            others = config.kv_extra_share / (len(names) - 1)
            shares = {c: (1.0 - config.kv_extra_share if i == 0 else others) for i, c in enumerate(names)}
            groups = plan_class_groups(cfg, loaded.dtype, budget, config.block_size, config.max_num_seqs,
                                       config.max_num_batched_tokens, self.kv_classes, shares)
        self.blocks = BlockManager(groups, config.block_size, config.enable_prefix_caching)
        self.pool = KVPool.allocate(cfg, groups, config.block_size, loaded.dtype, loaded.device, self.kv_codec,
                                    classes=self.kv_classes)
        full = next((g for g in groups if g.window is None), groups[0])
        # tokens one request can hold in each storage class (a request never uses more blocks than that)
        self.class_capacity = {c: (hi - lo - 1) * config.block_size for c, lo, hi in full.class_ranges()}
        self.max_model_len = min(max_len, self.class_capacity[next(iter(self.kv_classes))])
        self.cache_namespace = engine_namespace(loaded, config)  # model, tokenizer, KV codec, weights
        self.namespace = self.cache_namespace.key()
        sched_cfg = SchedulerConfig(config.max_num_seqs, config.max_num_batched_tokens, self.max_model_len)
        self.scheduler = Scheduler(sched_cfg, self.blocks, self.namespace)
        self.runner = ModelRunner(loaded.model, cfg, self.pool, self.blocks, loaded.device)
        if loaded.device.type == "cuda" and config.cuda_graphs:
            if len(self.kv_classes) == 1:
                self.runner.enable_cuda_graphs(loaded.dtype, config.max_num_seqs)
            else:  # graphs capture one store per layer; say so rather than drop them quietly
                log.warning("CUDA graphs are off: the KV pool holds several codecs (%s); decode steps run eagerly",
                            ", ".join(c or "native" for c in self.kv_classes))
        self.core = EngineCore(self.scheduler, self.runner, self.blocks, loaded.eos_token_ids,
                               self.max_model_len, cfg.vocab_size)
        self.core.burst = self._burst_steps(config)
        pipeline = config.burst_pipeline if config.burst_pipeline is not None else loaded.device.type == "cuda"
        self.core.burst_pipeline = pipeline and os.environ.get("AUGURY_BURST_PIPELINE", "1") != "0"
        self.drafters = build_drafters(self, config)
        # RAM budget + SSD tier; wraps drafters with own pools so their KV is cached too
        self.prefix_cache = attach_prefix_cache(self, self.cache_namespace)
        if self.drafters:
            curve = None
            if config.spec_adaptive:  # requests may turn speculation on even when the default is off
                from augury.spec.calibrate import measure_step_costs

                curve = measure_step_costs(loaded.model, self.pool, self.blocks, self.runner.windows, loaded.device,
                                           max_len=self.max_model_len)
            self.core.spec = SpecCoordinator(self.drafters, DraftPolicy(
                max_draft=config.num_draft_tokens, adaptive=config.spec_adaptive, curve=curve))
        self._commands: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self.core.has_pending = lambda: not self._commands.empty()  # stops chaining bursts past a command
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
        return run_in_fresh_thread(lambda: cls(load_random(shape, config), config))

    @classmethod
    def from_model(cls, model: str = "smollm2", **kwargs: Any) -> "Engine":
        return cls.build(EngineConfig(model=model, **kwargs))

    @classmethod
    def build(cls, config: EngineConfig) -> "Engine":
        """Load `config.model` and start the engine. Loading runs in a thread of its own that
        exits afterwards, so the engine thread is the only one holding OpenMP workers
        (see augury/engine/threads.py: on 2 cores that is worth ~40% of a decode step)."""
        return run_in_fresh_thread(lambda: cls(load_model(config), config))

    # ---- public API (any thread) -------------------------------------------
    def submit(self, prompt_ids: Sequence[int], params: SamplingParams | None = None,
               request_id: str | None = None) -> RequestHandle:
        req, handle = self._prepare(prompt_ids, params, request_id)
        self._commands.put(("add", [req]))
        return handle

    def _prepare(self, prompt_ids: Sequence[int], params: SamplingParams | None,
                 request_id: str | None) -> tuple[Request, RequestHandle]:
        """A validated request and its handle, counted as pending, not yet queued."""
        params = params or SamplingParams()
        params.validate()
        prompt = [int(t) for t in prompt_ids]
        kv_key, kv_blocks, kv_info = self._kv_plan(params, len(prompt))
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
        req.kv_key, req.kv_classes, req.kv_info = kv_key, kv_blocks, kv_info
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
        return req, handle

    def abort(self, request_id: str) -> None:
        self._commands.put(("abort", request_id))

    def _burst_steps(self, config: EngineConfig) -> int:
        """Greedy decode steps per burst: host overhead is what bursts save, so auto turns them
        on where the step itself is a cheap graph replay."""
        if config.decode_burst is not None:
            return max(0, int(config.decode_burst))
        from augury.engine.burst import AUTO_BURST_CUDA

        return AUTO_BURST_CUDA if self.runner.graphs is not None else 0

    @staticmethod
    def _storage_classes(config: EngineConfig, head_dim: int) -> dict:
        """Storage class name -> codec (with start 0), the default codec's class first."""
        from augury.kv.codecs import native_codec, parse_codec

        main = config.kv_codec()
        main.check_head_dim(head_dim)
        classes = {class_name(main): base_codec(main)}
        if main.start and not main.is_native:
            classes.setdefault("", native_codec())
        for spec in (config.kv_extra_codecs or "").split(","):
            if spec.strip():
                c = parse_codec(spec, config.kv_group_size)
                c.check_head_dim(head_dim)
                classes.setdefault(class_name(c), base_codec(c))
        return classes

    def _kv_plan(self, params: SamplingParams, prompt_len: int) -> tuple[str, BlockClasses, dict | None]:
        """A request's KV codec -> (run key, block classes, what the response reports).

        Each codec the request may ask for is a storage class of the pool (the server's
        default, native when a codec starts late, and --kv-extra-codecs); anything else
        is a 400 that names the flag. `start = N` keeps blocks below N (rounded up to a
        block) in the native class."""
        from augury.kv.codecs import codec_from_request

        want = self.kv_codec if params.kv_cache is None else codec_from_request(params.kv_cache, self.kv_codec)
        high = class_name(want)
        bs = self.config.block_size
        boundary = -(-want.start // bs) if want.start and not want.is_native else 0
        have = ", ".join(c or "native" for c in self.kv_classes)
        for cls in ({high} | ({""} if boundary else set())):
            if cls not in self.kv_classes:
                what = "native (for kv_cache.start)" if cls == "" else f"{want.name} ({cls})"
                raise ValueError(f"kv_cache: this server does not store KV as {what}; it stores {have}. "
                                 f"Start it with --kv-extra-codecs to serve more codecs per request")
        # a request whose codec has too little room could never be admitted: refuse it now
        need = min(prompt_len + params.max_tokens, self.max_model_len)
        n_low = min(boundary * bs, need)
        for cls, n in (("", n_low), (high, need - n_low)):
            if n and n > self.class_capacity[cls]:
                raise ValueError(f"kv_cache: {n} tokens of {cls or 'native'} KV do not fit this server's share "
                                 f"for that codec ({self.class_capacity[cls]} tokens); raise --kv-extra-share "
                                 f"or --kv-budget, or ask for fewer tokens")
        info = None
        if params.kv_cache is not None or len(self.kv_classes) > 1 or not self.kv_codec.is_native:
            # sliding-window layers store the request's codec too (their slots are read the same way)
            info = {"codec": want.name or want.id, "start": want.start if boundary else 0,
                    "sliding": (want.name or want.id) if self.model_config.sliding_window else None}
        return want.id, BlockClasses(high=high, low="", boundary=boundary), info

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
        """Submit all prompts at once (they share batches), wait for all. The engine loop takes them
        in one command, so the first step sees all of them: the batches, and with them the outputs,
        do not depend on how fast the prompts were queued."""
        plist = params if isinstance(params, (list, tuple)) else [params] * len(prompts)
        prepared: list[tuple[Request, RequestHandle]] = []
        try:
            for p, pp in zip(prompts, plist):
                prepared.append(self._prepare(self.tokenizer.encode(p) if isinstance(p, str) else list(p),
                                              None if pp is None else _copy_params(pp), None))
        except Exception:
            with self._lock:  # none of them was queued
                self._pending -= len(prepared)
            raise
        self._commands.put(("add", [req for req, _ in prepared]))
        return [self.collect(h) for _, h in prepared]

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
                                last.decode_s or 0.0, last.kv_cache)

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
            "kv_classes": [c or "native" for c in self.kv_classes],
            "prefix_cache_hit_tokens": self.blocks.prefix_hit_tokens,
            "prompt_tokens_total": c.prompt_tokens_total,
            "generation_tokens_total": c.generation_tokens_total,
            "requests_finished": c.requests_finished,
            "requests_aborted": c.requests_aborted,
            "preemptions": c.preemptions,
            "steps": c.steps,
            "burst_steps": c.burst_steps,
            "burst_chained": c.burst_chained,
            "burst_dropped": c.burst_dropped,
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
        if cmd == "add":  # one request (submit) or a batch's (generate_batch)
            with self._lock:
                self._pending -= len(arg)
            for req in arg:
                self.core.add(req)
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
