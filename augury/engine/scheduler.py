"""Continuous-batching scheduler: queues, admission, token budget, preemption.

No torch here. A request is "compute tokens [num_computed, num_tokens) (+ its
drafts), then sample if that reaches the end". Prefill, chunked prefill, decode,
prefix hits and draft verification are all that one thing.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from augury.engine.request import Request, RequestStatus
from augury.kv.block_manager import BlockManager


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int = 16
    max_num_batched_tokens: int = 512  # per-step token budget (prefill chunk size)
    max_model_len: int = 8192


@dataclass
class ScheduledSeq:
    request: Request
    num_new: int  # confirmed tokens to compute this step (excludes drafts)
    num_draft: int  # draft tokens appended after them (verify window)
    sample: bool  # the step reaches the end of the request's tokens → sample

    @property
    def num_cached(self) -> int:
        return self.request.num_computed


@dataclass
class SchedulerOutput:
    seqs: list[ScheduledSeq]
    preempted: list[Request]

    @property
    def num_tokens(self) -> int:
        return sum(s.num_new + s.num_draft for s in self.seqs)


class Scheduler:
    def __init__(self, config: SchedulerConfig, blocks: BlockManager, namespace: str = ""):
        self.config = config
        self.blocks = blocks
        self.namespace = namespace
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []

    # ---- queue management (engine thread only) ---------------------------
    def add(self, req: Request) -> None:
        req.status = RequestStatus.WAITING
        self.waiting.append(req)

    def remove(self, req: Request) -> None:
        """Drop a request in any state (finished, aborted, failed); frees its blocks."""
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        if req.finish_reason in ("stop", "length") and self.blocks.has(req.request_id):
            self.commit(req)  # the last step's tokens: publish their blocks before release
        self.blocks.free(req.request_id)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def _preempt(self, req: Request) -> None:
        # recompute-style: blocks go back (hashed ones stay reusable as cache)
        self.running.remove(req)
        self.blocks.free(req.request_id)
        req.num_computed = 0
        req.draft_ids = []
        req.status = RequestStatus.WAITING
        self.waiting.appendleft(req)

    # ---- the step ----------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        budget = self.config.max_num_batched_tokens
        seqs: list[ScheduledSeq] = []
        preempted: list[Request] = []

        for req in list(self.running):
            if budget <= 0:
                break
            if req not in self.running:  # preempted below by an earlier request
                continue
            n = min(req.num_tokens - req.num_computed, budget)
            n_draft = 0
            if n == req.num_tokens - req.num_computed and req.draft_ids:
                n_draft = max(0, min(len(req.draft_ids), budget - n,
                                     self.config.max_model_len - req.num_tokens - 1))
            while not self.blocks.grow(req.request_id, req.num_computed + n + n_draft):
                if n_draft:
                    n_draft = 0  # drop drafts before preempting anyone
                    continue
                # the latest request holding blocks of a class this one needs (freeing
                # another codec's blocks would not help it); possibly itself
                victim = next(r for r in reversed(self.running) if r is req or _share_class(r, req))
                self._preempt(victim)
                preempted.append(victim)
                if victim is req:
                    break
            if req not in self.running:
                continue
            req.draft_ids = req.draft_ids[:n_draft]
            seqs.append(ScheduledSeq(req, n, n_draft, req.num_computed + n == req.num_tokens))
            budget -= n + n_draft

        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs and not preempted:
            req = self.waiting[0]
            got = self.blocks.admit(req.request_id, req.all_ids, budget, self.namespace, req.kv_classes)
            if got is None:
                break
            cached, n = got
            self.waiting.popleft()
            req.num_computed = cached
            req.num_cached = cached
            req.status = RequestStatus.RUNNING
            self.running.append(req)
            seqs.append(ScheduledSeq(req, n, 0, cached + n == req.num_tokens))
            budget -= n
        return SchedulerOutput(seqs, preempted)

    def commit(self, req: Request) -> None:
        """After the step: publish confirmed blocks, drop any KV past num_computed."""
        self.blocks.trim(req.request_id, req.num_computed)
        self.blocks.commit(req.request_id, req.all_ids, req.num_computed, self.namespace)


def _classes(req: Request) -> set:
    c = req.kv_classes
    if c is None:
        return {None}
    return {c.high, c.low} if c.boundary else {c.high}


def _share_class(a: Request, b: Request) -> bool:
    """Whether two requests draw blocks from a common storage class of the pool."""
    return bool(_classes(a) & _classes(b))
