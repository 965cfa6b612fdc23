"""augury itself, in-process, timed from outside through the public Engine API."""

from __future__ import annotations

import time
from typing import Any, Sequence

from augury.bench.peers.base import BatchTiming, GenTiming
from augury.engine.types import SamplingParams


class AuguryPeer:
    def __init__(self, engine: Any, name: str = "augury"):
        self.engine = engine
        self.name = name

    @classmethod
    def load(cls, model: str, *, device: str, dtype: str, weights: str, threads: int, max_num_seqs: int = 16,
             spec: str = "off", spec_layers: int | None = None, kv_budget: str | None = None,
             max_model_len: int | None = None, compile: bool = False) -> "AuguryPeer":
        from augury.engine.engine import Engine

        # no prefix caching: a repeated prompt must be prefilled again each rep, as it is for the peers
        eng = Engine.from_model(model, device=device, dtype=dtype, weights=weights, threads=threads,
                                max_num_seqs=max_num_seqs, enable_prefix_caching=False, progress=False,
                                spec=spec, spec_layers=spec_layers, kv_budget=kv_budget,
                                max_model_len=max_model_len, compile=compile)
        return cls(eng)

    def _params(self, max_tokens: int, ignore_eos: bool, method: str | None) -> SamplingParams:
        spec: dict | bool = {"method": method} if method else False
        return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=ignore_eos, speculative=spec)

    def generate(self, ids: Sequence[int], max_tokens: int, ignore_eos: bool = True,
                 method: str | None = None) -> GenTiming:
        t0 = time.perf_counter()
        handle = self.engine.submit(list(ids), self._params(max_tokens, ignore_eos, method))
        n, ttft, last = 0, 0.0, None
        for out in handle:
            if out.token_ids and n == 0:
                ttft = time.perf_counter() - t0
            n += len(out.token_ids)
            last = out
        total = time.perf_counter() - t0
        if last is None or last.finish_reason == "error":
            raise RuntimeError(f"augury generation failed: {getattr(last, 'error', None)}")
        extras = {}
        if last.speculation:
            extras["mean_accepted_length"] = float(last.speculation.get("mean_accepted_length", 0.0))
            extras["acceptance_rate"] = float(last.speculation.get("acceptance_rate", 0.0))
        return GenTiming(len(ids), n, ttft, total, extras)

    def generate_batch(self, prompts: Sequence[Sequence[int]], max_tokens: int) -> BatchTiming:
        t0 = time.perf_counter()
        handles = [self.engine.submit(list(p), self._params(max_tokens, True, None)) for p in prompts]
        n, first = 0, 0.0
        for h in handles:
            for out in h:
                n += len(out.token_ids)
                if out.finish_reason == "error":
                    raise RuntimeError(f"augury generation failed: {out.error}")
                if out.finished and out.ttft_s:  # from the request's arrival, a few us after t0
                    first = max(first, out.ttft_s)
        return BatchTiming(n, time.perf_counter() - t0, len(prompts), first)

    def close(self) -> None:
        self.engine.shutdown()
