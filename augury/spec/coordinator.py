"""Speculation inside the engine step: ask drafters before scheduling, verify after.

    propose(running)       → req.draft_ids / req.draft_probs for decode-state requests
    (scheduler counts drafts as extra tokens; runner returns k+1 logits rows per request)
    verify(seqs, logits)   → per request: tokens to emit (accepted drafts + one), #accepted
    after emit             → drafter.on_verified, telemetry

Draft length per request adapts to its recent acceptance rate α (EMA): the
k-th draft token is worth proposing while α^k beats the measured marginal
cost of one more verify token at the current batch size (see `DraftPolicy`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from augury.engine.request import Request
from augury.engine.sampler import SamplingRow, greedy_tokens, processed_logprobs
from augury.engine.scheduler import ScheduledSeq
from augury.engine.types import TokenLogprob
from augury.spec.base import DraftSource, SpecStats
from augury.spec.calibrate import StepCostCurve
from augury.spec.verify import verify_greedy, verify_sampling


@dataclass
class DraftPolicy:
    """How many drafts to ask for: the n that maximizes expected tokens per unit of step time.

    A round of n drafts emits 1 + α₀(1 + α + ... + α^(n-1)) tokens on average (the verifier's own
    token plus each draft reached and accepted), where α₀ is the request's recent acceptance rate
    of a round's first draft and α that of a later draft given the ones before it passed. Two
    rates because acceptance is bursty: a prompt-lookup draft is often wrong at its first token
    (the copied span was not what the model says next) and, once right, right for a run
    (grounded set, SmolLM2: first position ~0.6, later ~0.85). One geometric rate would read
    each miss as a reason to stop drafting the next copy run. It costs
    the forward of (1 + n) tokens per request, where a plain decode step emits 1 token for the
    cost of one. The cost comes from `curve`, measured at engine start (`spec/calibrate.py`);
    without a curve each draft adds a fixed `marginal_cost` per request in the batch.

    Why not "draft while α^i exceeds the marginal cost": that stops where one more draft
    stops paying for itself in plain-decode units, but while speculation is ahead every
    unit of step time is already worth more than one token, so it over-drafts exactly
    when verify windows get expensive (the CPU int4 kernel's cost grows with rows)."""

    max_draft: int = 10
    adaptive: bool = True
    marginal_cost: float = 0.05
    ema: float = 0.3
    curve: StepCostCurve | None = None
    prior: float = 0.7  # a new request's first-draft acceptance (Request.spec_alpha_first)
    recover: float = 0.2  # per step without drafts, α₀ moves this share of the way back to the prior

    def length(self, req: Request, batch_size: int) -> int:
        k = min(req.spec_max_draft or self.max_draft, self.max_draft)
        if not self.adaptive:
            return k
        a = min(max(req.spec_alpha, 0.05), 0.98)
        reach = min(max(req.spec_alpha_first, 0.05), 0.98)  # chance the 1st draft is accepted
        best_n, best, tokens = 0, 1.0, 1.0  # n = 0: a plain step, 1 token per unit cost
        for n in range(1, k + 1):
            tokens += reach
            reach *= a
            rate = tokens / self._relative_cost(batch_size, n)
            if rate > best * (1 + 1e-9):  # ties go to fewer drafts (less KV churn)
                best_n, best = n, rate
        return best_n

    def _relative_cost(self, batch_size: int, n: int) -> float:
        """Step time with n drafts per request over a plain decode step's, same batch size."""
        b = max(1, batch_size)
        if self.curve is None:
            return 1.0 + n * min(0.95, self.marginal_cost * b)
        # other requests are assumed to draft about as much as this one
        return self.curve.cost(b * (1 + n)) / max(self.curve.cost(b), 1e-9)

    def rest(self, req: Request) -> None:
        """A decode step that drafted nothing teaches nothing, so α₀ drifts back toward the prior.
        Without this a request whose first few drafts missed would have α₀ near 0, never draft
        again and never learn otherwise (measured: 82 of 400 steps of the grounded set stuck there,
        and the adaptive policy lost to a fixed 3 drafts). A probe of one draft costs ~8% of a step."""
        if self.adaptive:
            req.spec_alpha_first += self.recover * (self.prior - req.spec_alpha_first)

    def update(self, req: Request, drafted: int, accepted: int) -> None:
        """α₀: the first draft passed or not. α: the chance one more draft is accepted given the
        ones before it were; a round tests positions only up to the first rejection, so positions
        2.. give `accepted - 1` successes in `accepted` trials (`accepted - 1` when all passed).
        accepted / drafted would count the positions after a rejection as failures too and make
        long drafts look bad."""
        if not drafted:
            return
        req.spec_alpha_first = (1 - self.ema) * req.spec_alpha_first + self.ema * (1.0 if accepted else 0.0)
        trials = accepted - 1 + (1 if accepted < drafted else 0)
        if accepted and trials:
            req.spec_alpha = (1 - self.ema) * req.spec_alpha + self.ema * ((accepted - 1) / trials)


class SpecCoordinator:
    def __init__(self, drafters: dict[str, DraftSource], policy: DraftPolicy):
        self.drafters = drafters
        self.policy = policy
        self.totals = {"drafted": 0, "accepted": 0, "rounds": 0}

    def propose(self, running: Sequence[Request], max_model_len: int) -> None:
        groups: dict[str, list[tuple[Request, int]]] = {}
        n_decode = sum(1 for r in running if r.num_computed == r.num_tokens - 1)
        for req in running:
            req.draft_ids, req.draft_probs = [], None
            if req.spec_method is None or req.num_computed != req.num_tokens - 1:
                continue
            left = min(req.params.max_tokens - len(req.output_ids), max_model_len - req.num_tokens) - 1
            k = min(self.policy.length(req, n_decode), left)
            if k > 0:
                groups.setdefault(req.spec_method, []).append((req, k))
            else:
                self.policy.rest(req)
        for method, items in groups.items():
            drafts = self.drafters[method].propose([r for r, _ in items], [k for _, k in items])
            for (req, k), d in zip(items, drafts):
                req.draft_ids = d.ids[:k]
                req.draft_probs = d.probs[: len(req.draft_ids)] if d.probs is not None else None

    def verify(self, seqs: Sequence[ScheduledSeq], logits: torch.Tensor, row_start: Sequence[int],
               want_logprobs: bool) -> dict[int, tuple[list[int], int, list[TokenLogprob] | None]]:
        """For each seq index with drafts: (tokens to emit, #accepted drafts, logprobs)."""
        rows: list[SamplingRow] = []
        spans: list[tuple[int, int, int]] = []  # (seq index, first row in logits, k)
        for i, s in enumerate(seqs):
            if not s.sample or s.num_draft == 0:
                continue
            req = s.request
            d = req.draft_ids[: s.num_draft]
            for j in range(s.num_draft + 1):
                rows.append(SamplingRow(params=req.params, prompt_ids=req.prompt_ids,
                                        output_ids=req.output_ids + d[:j], generator=req.generator))
            spans.append((i, row_start[i], s.num_draft))
        if not rows:
            return {}
        sel = torch.cat([logits[r:r + k + 1] for _, r, k in spans]) if len(spans) > 1 else \
            logits[spans[0][1]:spans[0][1] + spans[0][2] + 1]
        # all greedy: argmax only, no [rows, vocab] one-hot distributions to build and re-scan
        if all(seqs[i].request.generator is None for i, _, _ in spans) and all(r.params.greedy for r in rows):
            logp, greedy_ids = None, greedy_tokens(sel, rows).tolist()
        else:
            logp = processed_logprobs(sel, rows)
            greedy_ids = logp.argmax(dim=-1).tolist()
        raw = torch.log_softmax(sel.float(), dim=-1) if want_logprobs else None
        out = {}
        off = 0
        for i, _, k in spans:
            req = seqs[i].request
            d = req.draft_ids[:k]
            if req.generator is None:
                res = verify_greedy(greedy_ids[off:off + k + 1], d)
            else:
                q = req.draft_probs[:k] if req.draft_probs is not None else None
                if q is not None and q.shape[-1] < logp.shape[-1]:  # draft vocab may be narrower
                    q = torch.nn.functional.pad(q, (0, logp.shape[-1] - q.shape[-1]))
                res = verify_sampling(logp[off:off + k + 1], d, q, req.generator)
            lps = None
            if raw is not None and req.params.logprobs:
                lps = _token_logprobs(raw[off:off + len(res.tokens)], res.tokens, req.params.top_logprobs)
            out[i] = (res.tokens, res.num_accepted, lps)
            off += k + 1
        return out

    def record(self, req: Request, drafted: int, accepted: int) -> None:
        if req.spec_stats is None:
            req.spec_stats = SpecStats(req.spec_method or "")
        req.spec_stats.record(drafted, accepted)
        self.policy.update(req, drafted, accepted)
        self.totals["drafted"] += drafted
        self.totals["accepted"] += accepted
        self.totals["rounds"] += 1

    def on_verified(self, req: Request, accepted: int) -> None:
        if req.spec_method is not None:
            self.drafters[req.spec_method].on_verified(req, accepted)

    def release(self, req: Request) -> None:
        if req.spec_method is not None:
            self.drafters[req.spec_method].release(req)


def _token_logprobs(raw: torch.Tensor, tokens: list[int], top_k: int) -> list[TokenLogprob]:
    """raw [n, V] log-probs → the emitted tokens' logprobs and top-k (target's distribution)."""
    idx = torch.tensor(tokens, dtype=torch.long, device=raw.device)
    chosen = raw.gather(1, idx[:, None]).squeeze(1).tolist()
    tops: list[list[tuple[int, float]]] = [[] for _ in tokens]
    if top_k:
        v, ix = raw.topk(top_k, dim=-1)
        tops = [list(zip(a, b)) for a, b in zip(ix.tolist(), v.tolist())]
    return [TokenLogprob(t, c, tp) for t, c, tp in zip(tokens, chosen, tops)]
