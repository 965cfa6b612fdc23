"""Pure logit processors over a batch of rows.

Every function takes `x` float [N, V] (logits of N rows) plus per-row
parameter tensors on the same device, and modifies `x` IN PLACE (the caller
owns a private copy), returning it for chaining. Rows whose parameter is the
neutral value are left bit-for-bit unchanged, so processors can run over the
whole batch without per-row branching.

Tie rule shared by top-k and top-p: a token tied with the last kept token is
kept too, so the support depends only on values, never on sort order (HF's
TopKLogitsWarper keeps ties the same way).
"""

from __future__ import annotations

import torch
from torch import Tensor

NEG_INF = float("-inf")


def accumulation_dtype(device: torch.device) -> torch.dtype:
    """dtype for cumulative sums over the vocabulary: float64 where the device has it.

    A float32 cumsum over 262144 entries can drift by ~1e-3, enough to bias the tail.
    """
    return torch.float32 if device.type == "mps" else torch.float64


def apply_logit_bias(x: Tensor, row_idx: Tensor, tok_idx: Tensor, bias: Tensor) -> Tensor:
    """x[row_idx[j], tok_idx[j]] += bias[j]; all three are flat [M]."""
    x.index_put_((row_idx, tok_idx), bias.to(x.dtype), accumulate=True)
    return x


def apply_allowed_mask(x: Tensor, allowed: Tensor) -> Tensor:
    """Disallowed tokens get -inf. allowed: bool [N, V]."""
    return x.masked_fill_(~allowed, NEG_INF)


def apply_repetition_penalty(x: Tensor, row_idx: Tensor, tok_idx: Tensor, penalty: Tensor) -> Tensor:
    """HF/CTRL rule on seen tokens: logit > 0 -> logit / p, else logit * p.

    (row_idx, tok_idx): flat [M] pairs of every prompt + output token (repeats are
    harmless: all reads happen before the writes); penalty: [N], 1.0 = off.
    Touches only the M seen entries, not the whole [N, V].
    """
    vals = x[row_idx, tok_idx]  # [M]
    p = penalty.to(x.dtype)[row_idx]
    return x.index_put_((row_idx, tok_idx), torch.where(vals > 0, vals / p, vals * p))


def apply_presence_frequency(
    x: Tensor, row_idx: Tensor, tok_idx: Tensor, presence: Tensor, frequency: Tensor
) -> Tensor:
    """OpenAI rule: logit -= frequency * count + presence * (count > 0).

    (row_idx, tok_idx): flat [M] pairs, one per output token occurrence; presence,
    frequency: [N]. Each occurrence subtracts `frequency` once; each distinct
    (row, token) pair subtracts `presence` once.
    """
    x.index_put_((row_idx, tok_idx), -frequency.to(x.dtype)[row_idx], accumulate=True)
    key = torch.unique(row_idx * x.shape[-1] + tok_idx)  # distinct (row, token)
    rows_u, toks_u = key // x.shape[-1], key % x.shape[-1]
    return x.index_put_((rows_u, toks_u), -presence.to(x.dtype)[rows_u], accumulate=True)


def apply_temperature(x: Tensor, temperature: Tensor) -> Tensor:
    """x / T per row; temperature: [N] > 0."""
    return x.div_(temperature[:, None].to(x.dtype))


def apply_top_k(x: Tensor, k: Tensor, k_max: int) -> Tensor:
    """Keep tokens whose logit is >= the k-th largest of their row (ties kept).

    k: long [N], 0 = off; values above V mean the whole row. k_max: max over rows of
    min(k, V) for rows with k > 0 (host-side, so topk's size needs no sync).
    """
    if k_max <= 0:
        return x
    vals = torch.topk(x, k_max, dim=-1).values  # [N, k_max], descending
    kth = (k.clamp(min=1, max=k_max) - 1)[:, None]
    thresh = vals.gather(1, kth)  # [N, 1]
    thresh = torch.where((k > 0)[:, None], thresh, torch.full_like(thresh, NEG_INF))
    return x.masked_fill_(x < thresh, NEG_INF)


def apply_top_p(x: Tensor, top_p: Tensor, first_k: int | None = 256) -> Tensor:
    """Keep the smallest set of most likely tokens whose mass reaches top_p (ties kept).

    top_p: [N] in (0, 1]; rows with top_p >= 1 are left untouched (no rounding can
    shave their tail). first_k: on the CPU a full sort of 262k entries costs ~30 ms a
    row, so try the best first_k tokens (x8 until the mass is reached; the host check
    is free on the CPU); None -> one full sort, the choice on accelerators where a
    host check would be a sync. Both give the same support.
    """
    vocab = x.shape[-1]
    probs = x.softmax(dim=-1)  # [N, V]
    # Rows that are off compare against 2.0, which no cumulative mass reaches.
    target = torch.where(top_p >= 1.0, torch.full_like(top_p, 2.0), top_p)[:, None]
    k = vocab if first_k is None else min(first_k, vocab)
    while True:
        if k >= vocab:
            head = probs.sort(dim=-1, descending=True).values  # [N, V]
        else:
            head = torch.topk(probs, k, dim=-1).values  # [N, k], descending
        cum = head.to(accumulation_dtype(x.device)).cumsum(dim=-1)
        if k >= vocab or bool((cum[:, -1:] >= target.to(cum.dtype)).all()):
            break
        k *= 8
    # Index of the first sorted token at which the mass reaches top_p.
    cut = (cum < target.to(cum.dtype)).sum(dim=-1).clamp_(max=head.shape[-1] - 1)
    thresh = head.gather(1, cut[:, None])  # [N, 1]
    return x.masked_fill_(probs < thresh, NEG_INF)


def apply_min_p(x: Tensor, min_p: Tensor) -> Tensor:
    """Keep tokens with p >= min_p * p_max, i.e. logit >= max_logit + log(min_p).

    Working in log space skips a softmax; min_p = 0 gives log 0 = -inf (off).
    """
    floor = x.amax(dim=-1, keepdim=True) + min_p[:, None].to(x.dtype).log()
    return x.masked_fill_(x < floor, NEG_INF)


def one_hot_logprobs(token_ids: Tensor, vocab: int, dtype: torch.dtype) -> Tensor:
    """The distribution of a greedy row: log 1 at its token, -inf elsewhere. -> [N, V]"""
    out = torch.full((token_ids.shape[0], vocab), NEG_INF, dtype=dtype, device=token_ids.device)
    return out.scatter_(1, token_ids[:, None], 0.0)
