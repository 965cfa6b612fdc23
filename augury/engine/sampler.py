"""The sampler: the only place tokens are chosen, for plain decode and verification.

A pure function of logits [N, V] and one `SamplingRow` per logits row. Rows
are independent: a row's token depends only on its logits, its parameters,
its history and its own generator, never on what else is in the batch.

Processing order (vLLM's, with bias first so a bias can be penalized like any logit):
  1. logit_bias, then the grammar's allowed mask (-inf outside it)
  2. repetition penalty (prompt + output), presence and frequency penalties (output)
  -- greedy rows stop here: argmax (ties -> lowest id, as torch.argmax)
  3. temperature  4. top-k  5. top-p  6. min-p  7. draw from softmax of what is left

The draw is inverse-CDF sampling with ONE float64 uniform per sampled row taken
from that row's own CPU generator, so a seeded request replays the same tokens
whatever the batch, and a step costs N scalar draws instead of N*V noise.

Reported logprobs are those of the model's raw distribution (log_softmax of
the logits before any processing) — vLLM's default, and what users compare
across sampling settings. `processed_logprobs` gives the distribution that is
actually sampled from (the speculative verifier needs that one).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain

import torch
from torch import Tensor

from augury.cpu_kernels.argmax import argmax_last
from augury.engine.sampling import processors as P
from augury.engine.types import SamplingParams


@dataclass
class SamplingRow:
    """Everything needed to choose the token of one logits row."""

    params: SamplingParams
    prompt_ids: Sequence[int]  # for repetition_penalty
    output_ids: Sequence[int]  # tokens generated before this row's token (all penalties)
    generator: torch.Generator | None  # CPU RNG from make_generator; None only for greedy rows
    # bool [V'] from a grammar matcher; disallowed tokens get -inf. If V' < V the
    # extra (padding) ids of the logits count as disallowed.
    allowed_mask: Tensor | None = None


@dataclass
class SamplerOutput:
    token_ids: Tensor  # [N] long, CPU
    # [N] float32: logprob of the chosen token under the model's RAW distribution
    logprobs: Tensor | None = None
    # [N, k] for k = the largest top_logprobs asked for, best first, raw distribution;
    # rows that asked for fewer slice their own prefix. None when k == 0.
    top_ids: Tensor | None = None
    top_logprobs: Tensor | None = None


def make_generator(seed: int | None) -> torch.Generator:
    """A per-request CPU generator: seeded -> reproducible, None -> fresh OS entropy."""
    if seed is None:
        seed = int.from_bytes(os.urandom(8), "little")
    g = torch.Generator(device="cpu")
    g.manual_seed(seed % (1 << 64))  # any Python int (negative, huge) maps to a valid seed
    return g


# ---------------------------------------------------------------- drawing


def _uniforms(generators: Sequence[torch.Generator]) -> list[float]:
    """One float64 uniform in [0, 1) per generator; CPU only, so no device sync."""
    return [torch.rand(1, generator=g, dtype=torch.float64).item() for g in generators]


def _inverse_cdf(logp: Tensor, u: Tensor, block: int = 256) -> Tensor:
    """Token whose CDF interval contains u * total mass. logp [S, V] (unnormalized ok),
    u [S] -> [S] long. Zero-mass tokens are never chosen.

    Two levels keep it exact and cheap: float32 sums of `block`-token blocks, a
    float64 CDF over the blocks, then a float64 CDF inside the chosen block only.
    (A float32 CDF over 262k tokens can drift by ~1e-3; a float64 one over the
    whole row costs ~3x the rest of the sampler on the CPU.)
    """
    s, vocab = logp.shape
    acc = P.accumulation_dtype(logp.device)
    # Shift by the row max so unnormalized log-weights (a verifier's residual) cannot overflow.
    logp = logp.float()
    p = (logp - logp.amax(dim=-1, keepdim=True)).exp()  # [S, V]
    if vocab % block:
        p = torch.nn.functional.pad(p, (0, block - vocab % block))
    blocks = p.view(s, -1, block)  # [S, nb, block]
    bcdf = blocks.sum(dim=-1).to(acc).cumsum(dim=-1)  # [S, nb], nondecreasing
    target = u.to(acc)[:, None] * bcdf[:, -1:]  # [S, 1]
    b = _search_positive(bcdf, target)  # [S, 1] a block with mass
    before = torch.where(b > 0, bcdf.gather(1, (b - 1).clamp(min=0)), 0.0)
    inner = blocks.gather(1, b[:, :, None].expand(s, 1, block)).squeeze(1)  # [S, block]
    j = _search_positive(inner.to(acc).cumsum(dim=-1), target - before)
    return (b * block + j).squeeze(1)


def _search_positive(cdf: Tensor, x: Tensor) -> Tensor:
    """First index whose cdf [S, M] exceeds x [S, 1], capped at the last index that
    carries mass: rounding (or u rounded to 1 in float32 on MPS) may put x at the top."""
    idx = torch.searchsorted(cdf, x, right=True)
    last = torch.searchsorted(cdf, cdf[:, -1:].contiguous(), right=False)
    return torch.minimum(idx, last)


def draw_from_logprobs(logp: Tensor, generators: Sequence[torch.Generator | None]) -> Tensor:
    """Draw one token per row of logp [N, V] (log-probs, -inf = excluded; need not be
    normalized) exactly as sample() draws: one uniform per row from its generator.
    A None generator takes the row's argmax (greedy rows). -> [N] long, logp's device."""
    if len(generators) != logp.shape[0]:
        raise ValueError(f"{len(generators)} generators for {logp.shape[0]} rows")
    live = [i for i, g in enumerate(generators) if g is not None]
    if not live:
        return argmax_last(logp)
    u = torch.tensor(_uniforms([generators[i] for i in live]), device=logp.device)
    if len(live) == len(generators):
        return _inverse_cdf(logp, u)
    tokens = argmax_last(logp)
    idx = torch.tensor(live, device=logp.device)
    return tokens.index_copy_(0, idx, _inverse_cdf(logp.index_select(0, idx), u))


# ---------------------------------------------------------------- processing

_TOP_P_FIRST_K = 256  # head size tried first for top-p on the CPU (x8 until it holds the mass)


def _needs_adjusting(rows: Sequence[SamplingRow]) -> bool:
    return any(
        r.allowed_mask is not None
        or r.params.logit_bias
        or r.params.repetition_penalty != 1.0
        or r.params.presence_penalty != 0.0
        or r.params.frequency_penalty != 0.0
        for r in rows
    )


def _flat_ids(id_lists: Sequence[Sequence[int]], device: torch.device) -> tuple[Tensor, Tensor]:
    """Row index and token id of every entry of ragged lists -> ([M], [M]) long."""
    lengths = torch.tensor([len(ids) for ids in id_lists], device=device)
    rows = torch.repeat_interleave(torch.arange(len(id_lists), device=device), lengths)
    ids = torch.tensor(list(chain.from_iterable(id_lists)), dtype=torch.long, device=device)
    return rows, ids


def _adjusted_logits(logits: Tensor, rows: Sequence[SamplingRow]) -> Tensor:
    """Steps 1-2 (bias, mask, penalties) on a private copy. logits [N, V] -> [N, V]."""
    n, vocab = logits.shape
    dev = logits.device
    if not _needs_adjusting(rows):
        return logits
    x = logits.to(torch.float32, copy=True)

    bias = [(i, t, b) for i, r in enumerate(rows) for t, b in r.params.logit_bias.items()]
    if bias:
        bad = [t for _, t, _ in bias if not 0 <= int(t) < vocab]
        if bad:
            raise ValueError(f"logit_bias: token ids out of range [0, {vocab}): {bad[:5]}")
        ri, ti, bv = zip(*bias)
        P.apply_logit_bias(
            x,
            torch.tensor(ri, device=dev),
            torch.tensor([int(t) for t in ti], device=dev),
            torch.tensor(bv, dtype=torch.float32, device=dev),
        )

    masked = [i for i, r in enumerate(rows) if r.allowed_mask is not None]
    if masked:
        allowed = torch.zeros((len(masked), vocab), dtype=torch.bool, device=dev)
        for j, i in enumerate(masked):
            m = rows[i].allowed_mask.to(device=dev, dtype=torch.bool)
            w = min(m.shape[-1], vocab)
            allowed[j, :w] = m[:w]
        if len(masked) == n:
            P.apply_allowed_mask(x, allowed)
        else:
            idx = torch.tensor(masked, device=dev)
            x.index_copy_(0, idx, P.apply_allowed_mask(x.index_select(0, idx), allowed))

    # Penalties only visit the histories of the rows that use them: O(history), not O(N*V).
    rep = [i for i, r in enumerate(rows) if r.params.repetition_penalty != 1.0]
    if rep:
        ri, ti = _flat_ids([[*rows[i].prompt_ids, *rows[i].output_ids] for i in rep], dev)
        pen = torch.tensor([r.params.repetition_penalty for r in rows], device=dev)
        P.apply_repetition_penalty(x, torch.tensor(rep, device=dev)[ri], ti, pen)

    pf = [i for i, r in enumerate(rows) if r.params.presence_penalty or r.params.frequency_penalty]
    if pf:
        ri, ti = _flat_ids([rows[i].output_ids for i in pf], dev)
        pres = torch.tensor([r.params.presence_penalty for r in rows], device=dev)
        freq = torch.tensor([r.params.frequency_penalty for r in rows], device=dev)
        P.apply_presence_frequency(x, torch.tensor(pf, device=dev)[ri], ti, pres, freq)
    return x


def _shaped_logprobs(x: Tensor, params: Sequence[SamplingParams]) -> Tensor:
    """Steps 3-6 for sampled rows, then log_softmax. x [S, V] (adjusted logits;
    may be the caller's tensor, so the first write goes to a copy) -> [S, V]."""
    dev, vocab = x.device, x.shape[-1]
    temp = torch.tensor([p.temperature for p in params], dtype=torch.float32, device=dev)
    x = x.div(temp[:, None])  # new tensor: everything below may work in place

    ks = [min(p.top_k, vocab) if p.top_k > 0 else 0 for p in params]
    if any(k < vocab for k in ks if k > 0):
        k_max = max(ks)
        P.apply_top_k(x, torch.tensor(ks, device=dev), k_max)

    top_p_rows = [i for i, p in enumerate(params) if p.top_p < 1.0]
    if top_p_rows:
        # The sort is the costly part: run it only on the rows that ask, and on the
        # CPU (where a host check is free) on a top-k head first.
        first_k = _TOP_P_FIRST_K if dev.type == "cpu" else None
        tp = torch.tensor([params[i].top_p for i in top_p_rows], dtype=torch.float32, device=dev)
        if len(top_p_rows) == len(params):
            P.apply_top_p(x, tp, first_k)
        else:
            idx = torch.tensor(top_p_rows, device=dev)
            x.index_copy_(0, idx, P.apply_top_p(x.index_select(0, idx), tp, first_k))

    if any(p.min_p > 0.0 for p in params):
        mp = torch.tensor([p.min_p for p in params], dtype=torch.float32, device=dev)
        P.apply_min_p(x, mp)
    return x.log_softmax(dim=-1)


def _split(rows: Sequence[SamplingRow]) -> tuple[list[int], list[int]]:
    greedy = [i for i, r in enumerate(rows) if r.params.greedy]
    sampled = [i for i, r in enumerate(rows) if not r.params.greedy]
    for i in sampled:
        if rows[i].generator is None:
            raise ValueError(f"row {i}: temperature > 0 needs a generator (make_generator)")
    return greedy, sampled


def _take_rows(x: Tensor, idx: list[int], n: int) -> Tensor:
    return x if len(idx) == n else x.index_select(0, torch.tensor(idx, device=x.device))


def greedy_tokens(logits: Tensor, rows: Sequence[SamplingRow]) -> Tensor:
    """All rows greedy: the token each would emit, [N] long — the argmax of
    `processed_logprobs` without building its [N, V] one-hot rows (the verify hot path)."""
    if any(not r.params.greedy for r in rows):
        raise ValueError("greedy_tokens takes greedy rows only")
    return argmax_last(_adjusted_logits(logits, rows))


def processed_logprobs(logits: Tensor, rows: Sequence[SamplingRow]) -> Tensor:
    """The distribution each row is actually sampled from, as log-probs. logits [N, V]
    -> [N, V] float32, -inf outside the support; a greedy row is one-hot at its argmax
    (after bias, mask and penalties)."""
    n, vocab = logits.shape
    greedy, sampled = _split(rows)
    x = _adjusted_logits(logits, rows)
    out = torch.empty((n, vocab), dtype=torch.float32, device=logits.device)
    if greedy:
        g = argmax_last(_take_rows(x, greedy, n))
        out[greedy] = P.one_hot_logprobs(g, vocab, torch.float32)
    if sampled:
        out[sampled] = _shaped_logprobs(_take_rows(x, sampled, n), [rows[i].params for i in sampled])
    return out


def sample(
    logits: Tensor, rows: Sequence[SamplingRow], want_logprobs: bool | None = None
) -> SamplerOutput:
    """Choose one token per row. logits float [N, V], one SamplingRow per row.

    want_logprobs: None -> computed when some row asks (logprobs or top_logprobs);
    False -> skipped; True -> always. Sampled rows consume exactly one uniform each
    from their generator; greedy rows consume none.
    """
    n, vocab = logits.shape
    if len(rows) != n:
        raise ValueError(f"{len(rows)} rows for {n} logits rows")
    greedy, sampled = _split(rows)

    x = _adjusted_logits(logits, rows)
    if not sampled:
        tokens = argmax_last(x)  # the all-greedy fast path when nothing was adjusted
    else:
        logp = _shaped_logprobs(_take_rows(x, sampled, n), [rows[i].params for i in sampled])
        u = torch.tensor(_uniforms([rows[i].generator for i in sampled]), device=x.device)
        drawn = _inverse_cdf(logp, u)
        if not greedy:
            tokens = drawn
        else:
            tokens = argmax_last(x)
            tokens.index_copy_(0, torch.tensor(sampled, device=x.device), drawn)

    if want_logprobs is None:
        want_logprobs = any(r.params.logprobs or r.params.top_logprobs > 0 for r in rows)
    out = SamplerOutput(token_ids=tokens)
    if want_logprobs:
        raw = logits.float().log_softmax(dim=-1)  # [N, V]
        out.logprobs = raw.gather(1, tokens[:, None]).squeeze(1)
        k = min(max(r.params.top_logprobs for r in rows), vocab)
        if k > 0:
            out.top_logprobs, out.top_ids = torch.topk(raw, k, dim=-1)
    return _to_host(out)


def _to_host(out: SamplerOutput) -> SamplerOutput:
    """Move results to the CPU with one wait: the side tensors are queued as async
    copies, then the blocking copy of token_ids drains the stream behind them."""
    if out.token_ids.device.type == "cpu":
        return out
    for name in ("logprobs", "top_ids", "top_logprobs"):
        t = getattr(out, name)
        if t is not None:
            setattr(out, name, t.to("cpu", non_blocking=True))
    out.token_ids = out.token_ids.cpu()
    return out
