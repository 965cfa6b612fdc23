"""EngineCore: one engine step = schedule → execute → sample → update.

Runs on the engine thread only. It owns the scheduler, block manager, KV
pool and runner; requests reach it as `Request` objects and leave as
`RequestOutput` deltas pushed into each request's sink.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from augury.engine.model_runner import BurstRun, ModelRunner
from augury.engine.request import Request, RequestStatus
from augury.engine.sampler import SamplingRow, sample
from augury.engine.scheduler import Scheduler, SchedulerOutput
from augury.engine.burst import burst_length, chain_length
from augury.engine.types import RequestOutput, TokenLogprob
from augury.kv.block_manager import BlockManager
from augury.spec.coordinator import SpecCoordinator

log = logging.getLogger("augury")


@dataclass
class EngineCounters:
    prompt_tokens_total: int = 0
    generation_tokens_total: int = 0
    requests_finished: int = 0
    requests_aborted: int = 0
    steps: int = 0
    burst_steps: int = 0  # forwards run inside decode bursts (engine/burst.py)
    burst_chained: int = 0  # bursts launched behind one still in flight (pipelined bursts)
    burst_dropped: int = 0  # chained bursts dropped whole because a request stopped before them
    preemptions: int = 0
    extra: dict = field(default_factory=dict)


class EngineCore:
    def __init__(self, scheduler: Scheduler, runner: ModelRunner, blocks: BlockManager,
                 eos_token_ids: list[int], max_model_len: int, vocab_size: int):
        self.scheduler = scheduler
        self.runner = runner
        self.blocks = blocks
        self.eos = set(eos_token_ids)
        self.max_model_len = max_model_len
        self.vocab_size = vocab_size
        self.requests: dict[str, Request] = {}
        self.counters = EngineCounters()
        self.spec: SpecCoordinator | None = None  # set by the Engine when speculation is configured
        self.burst = 0  # most greedy decode steps per burst (engine/burst.py); < 2 = off
        self.burst_pipeline = True  # launch the next burst before waiting for the one in flight
        # whether a command (new request, abort) waits for the engine loop: no chaining past it
        self.has_pending: Callable[[], bool] = lambda: False
        self._in_flight: BurstRun | None = None  # a chained burst launched, not yet waited for

    # ---- request lifecycle -----------------------------------------------
    def add(self, req: Request) -> None:
        self.requests[req.request_id] = req
        self.scheduler.add(req)

    def abort(self, request_id: str) -> None:
        req = self.requests.get(request_id)
        if req is None or req.finished:
            return
        req.aborted = True
        self.counters.requests_aborted += 1
        self._finish(req, "abort")

    def fail_all(self, message: str) -> None:
        self._in_flight = None  # its requests fail below; their tokens are dropped
        for req in list(self.requests.values()):
            req.error = message
            self._finish(req, "error")

    def _finish(self, req: Request, reason: str, text: str = "", ids: list[int] | None = None,
                lps: list[TokenLogprob] | None = None, flush: bool = True) -> None:
        """End a request: free its blocks, release held-back text, push the final delta."""
        req.status = RequestStatus.FINISHED
        req.finish_reason = reason  # type: ignore[assignment]
        self.scheduler.remove(req)
        if self.spec is not None:
            self.spec.release(req)
        self.requests.pop(req.request_id, None)
        if flush and req.detok is not None:
            text += req.detok.flush()
        self.counters.requests_finished += 1
        self._emit(req, text, ids or [], lps or [], finished=True)

    def _emit(self, req: Request, text: str, ids: list[int], lps: list[TokenLogprob],
              finished: bool = False) -> None:
        if req.sink is None:
            return
        now = time.monotonic()
        out = RequestOutput(
            request_id=req.request_id, text=text, token_ids=ids,
            logprobs=lps if req.params.logprobs else None,
            finished=finished, finish_reason=req.finish_reason if finished else None,
            prompt_tokens=len(req.prompt_ids), completion_tokens=len(req.output_ids),
            cached_tokens=req.num_cached, error=req.error,
        )
        if finished and req.spec_stats is not None:
            out.speculation = req.spec_stats.as_dict()
        if finished and req.kv_info is not None:
            bs = self.blocks.block_size
            low = req.kv_classes.boundary * bs if req.kv_classes is not None else 0
            out.kv_cache = {**req.kv_info, "boundary": min(low, req.num_computed) if low else 0}
        if finished:
            first = req.first_token_time
            out.ttft_s = (first - req.arrival) if first else None
            out.prefill_s = (first - req.admit_time) if (first and req.admit_time) else None
            out.decode_s = (now - first) if first else None
        req.sink.push(out)

    # ---- the step ------------------------------------------------------------
    def has_work(self) -> bool:
        return self._in_flight is not None or self.scheduler.has_work()

    def step(self) -> None:
        if self._in_flight is not None:  # a chained burst: emit it (chaining the next) before scheduling
            run, self._in_flight = self._in_flight, None
            self._emit_burst(run)
            return
        if self.spec is not None:
            self.spec.propose(self.scheduler.running, self.max_model_len)
        sched = self.scheduler.schedule()
        self.counters.preemptions += len(sched.preempted)
        for req in sched.preempted:
            if self.spec is not None:
                self.spec.release(req)
        if not sched.seqs:
            return
        n_burst = burst_length(sched, self.burst, self.max_model_len, not self.scheduler.waiting)
        if n_burst and all(self.blocks.grow(s.request.request_id, s.request.num_tokens - 1 + n_burst)
                           for s in sched.seqs):
            self._burst(sched, n_burst)
            return
        now = time.monotonic()
        for s in sched.seqs:
            if s.request.admit_time is None:
                s.request.admit_time = now
            if s.request.num_computed < len(s.request.prompt_ids):
                self.counters.prompt_tokens_total += s.num_new
        step = self.runner.execute(sched)
        self.counters.steps += 1
        tokens, lps = self._sample(sched, step.logits, step.row_start)
        verified = {}
        if self.spec is not None and any(s.num_draft for s in sched.seqs):
            verified = self.spec.verify(sched.seqs, step.logits, step.row_start,
                                        any(s.request.params.logprobs for s in sched.seqs))
        for i, s in enumerate(sched.seqs):
            req = s.request
            req.num_computed += s.num_new
            if i in verified:
                burst, accepted, blps = verified[i]
                self.spec.record(req, s.num_draft, accepted)
                for j, tok in enumerate(burst):
                    self._append(req, tok, blps[j] if blps else None)
                    if req.finished:
                        break
                if not req.finished:
                    req.num_computed += accepted
                    self.spec.on_verified(req, accepted)
            elif s.sample:
                self._append(req, tokens[i], lps[i] if lps is not None else None)
            req.draft_ids = []
            if not req.finished:
                self.scheduler.commit(req)

    def _burst(self, sched: SchedulerOutput, n: int) -> None:
        """n greedy decode steps at once; tokens go out one by one as in n normal steps
        (a request that stops mid-burst drops the rest; commit trims its KV)."""
        run = self.runner.launch_burst([s.request for s in sched.seqs], n)
        self.counters.steps += n
        self.counters.burst_steps += n
        self._emit_burst(run)

    def _chain(self, run: BurstRun) -> BurstRun | None:
        """Launch the burst that follows `run` (still in flight) for the same requests, when
        engine/burst.py's chain_length allows it and the block tables can grow to cover it."""
        if not self.burst_pipeline:
            return None
        n = chain_length(run.reqs, self.scheduler.running, run.n, self.burst, self.max_model_len,
                         not self.scheduler.waiting and not self.has_pending())
        # positions num_computed .. + run.n are run's; this burst writes the n after them
        if not n or not all(self.blocks.grow(r.request_id, r.num_computed + run.n + n) for r in run.reqs):
            return None  # blocks grown for nothing are trimmed by the commit below
        nxt = self.runner.launch_burst(run.reqs, n, after=run)
        self.counters.steps += n
        self.counters.burst_steps += n
        self.counters.burst_chained += 1
        return nxt

    def _emit_burst(self, run: BurstRun) -> None:
        """Chain the next burst behind `run` if allowed, then wait for `run` and emit its tokens
        one by one as normal steps would. A request that stops (or was aborted) drops the rest
        of its tokens. The chained burst is then dropped whole: it computed the others in a batch
        that still held the stopped request, which an unchained engine would no longer run (on a
        GPU the batch size picks the kernels, so the tokens could differ); its K/V lies past every
        request's confirmed tokens and is never published. That costs at most one burst per stop."""
        nxt = self._chain(run)
        self._in_flight = nxt
        live = []
        for req, toks in zip(run.reqs, self.runner.burst_tokens(run)):
            if req.finished:  # stopped inside the burst before, or aborted: nothing of this one counts
                continue
            for tok in toks:
                req.num_computed += 1
                self._append(req, tok, None)
                if req.finished:
                    break
            if not req.finished:
                live.append(req)
        if nxt is not None and len(live) < len(run.reqs):
            self._in_flight = nxt = None
            self.counters.burst_dropped += 1
        for req in live:
            if nxt is None:
                self.scheduler.commit(req)
            else:  # publish the confirmed blocks, but keep the ones the chained burst is writing
                self.blocks.commit(req.request_id, req.all_ids, req.num_computed, self.scheduler.namespace)

    def _sample(self, sched: SchedulerOutput, logits: torch.Tensor, row_start: list[int]):
        rows: list[SamplingRow] = []
        owners: list[int] = []
        for i, s in enumerate(sched.seqs):
            if not s.sample or s.num_draft:
                continue
            req = s.request
            mask = None
            if req.matcher is not None:
                mask = req.matcher.fill_mask()
                if mask.shape[0] < logits.shape[1]:
                    mask = torch.nn.functional.pad(mask, (0, logits.shape[1] - mask.shape[0]), value=False)
            rows.append(SamplingRow(params=req.params, prompt_ids=req.prompt_ids, output_ids=req.output_ids,
                                    generator=req.generator, allowed_mask=mask))
            owners.append(i)
        tokens: list[int | None] = [None] * len(sched.seqs)
        lps: list[TokenLogprob | None] | None = None
        if not rows:
            return tokens, lps
        # the first row of each sampled request's window
        first = [row_start[i] for i in owners]
        if first == list(range(logits.shape[0])):
            sel = logits
        else:
            sel = logits.index_select(0, torch.tensor(first, dtype=torch.long, device=logits.device))
        out = sample(sel, rows)
        ids = out.token_ids.tolist()
        if out.logprobs is not None:
            lps = [None] * len(sched.seqs)
            lp = out.logprobs.tolist()
            top_ids = out.top_ids.tolist() if out.top_ids is not None else None
            top_lp = out.top_logprobs.tolist() if out.top_logprobs is not None else None
        for j, i in enumerate(owners):
            tokens[i] = ids[j]
            if lps is not None:
                k = sched.seqs[i].request.params.top_logprobs
                top = list(zip(top_ids[j][:k], top_lp[j][:k])) if (top_ids is not None and k) else []
                lps[i] = TokenLogprob(ids[j], lp[j], top)
        return tokens, lps

    def _append(self, req: Request, token: int, lp: TokenLogprob | None) -> None:
        """Emit one token through the stop / EOS / detokenizer path."""
        if req.first_token_time is None:
            req.first_token_time = time.monotonic()
        req.output_ids.append(token)
        self.counters.generation_tokens_total += 1
        p = req.params
        lps = [lp] if lp is not None else []
        if req.logprobs is not None and lp is not None:
            req.logprobs.append(lp)
        reason = None
        text = ""
        stopped_by_string = False
        if (token in self.eos and not p.ignore_eos) or token in p.stop_token_ids:
            reason = "stop"  # EOS / stop ids are never emitted as text
        else:
            if req.detok is not None:
                text, stopped_by_string = req.detok.add(token)
                if stopped_by_string:
                    reason = "stop"
            if req.matcher is not None:
                req.matcher.accept(token)
                if reason is None and req.matcher.is_terminated():
                    reason = "stop"
        if reason is None and len(req.output_ids) >= p.max_tokens:
            reason = "length"
        if reason is None and req.num_tokens >= self.max_model_len:
            reason = "length"
        if reason is None:
            self._emit(req, text, [token], lps)
        else:
            self._finish(req, reason, text, [token], lps, flush=not stopped_by_string)
