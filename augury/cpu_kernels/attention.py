"""Native few-query paged attention (attention.cpp): the per-step row plan and the call.

The kernel reads each query row's keys and values straight from the paged pools through the
step's `gather_slots`, so a layer costs one op instead of a gather, a dozen tiny torch ops and
their dispatch. Every (row, KV head) pair is computed on its own in a fixed order, so a row's bits
do not depend on the other rows of the call: a verify-window row equals its lone decode step
(what keeps speculation exactly plain greedy), without the bucketing of
`layers/attention_decode_cpu.py`, which stays the path when the library is not loaded.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

DTYPES = (torch.float32, torch.bfloat16)

# Split (row, KV head) pairs over torch's threads when a call has at least this much work (sum over
# rows of keys x query heads x head dim), or never when None. Measured on 2 Zen 4 cores shared with
# another job: 2 threads took 4 rows x 150 keys from 20 to 13 us on a quiet moment, and 11 rows x
# 150 keys from 50 us to 12 ms when the other job ran (a barrier waiting out a time slice, as
# SINGLE_THREADED in layers/attention_decode_cpu.py describes). A layer's attention is a few tens
# of microseconds: not worth that risk, so one thread. The result is bitwise the same either way.
PARALLEL_MIN_WORK: int | None = None


@dataclass
class RowPlan:
    """Host-side, once per step (every layer of the KV group shares it)."""

    rows: torch.Tensor  # [T, 3] int32: per flat query row (request, first key, end key) in gather_slots
    parallel: bool


def supports(q: torch.Tensor, k_pool: torch.Tensor) -> bool:
    """Whether the kernel takes this layer's tensors (plain CPU pools of float32 / bfloat16)."""
    return (isinstance(k_pool, torch.Tensor) and q.device.type == "cpu" and k_pool.device.type == "cpu"
            and q.dtype in DTYPES and k_pool.dtype in DTYPES)


def make_plan(mask: torch.Tensor, out_index: torch.Tensor | None, dense: bool, num_heads: int,
              head_dim: int) -> RowPlan:
    """Each flat row's request and visible key range [lo, hi) in its request's gather_slots, read
    from the step's mask [B, 1, max_q, max_kv] (True = attend: a causal prefix, or a sliding
    window's contiguous range). out_index: padded slot b * max_q + j of each flat row, or None."""
    B, _, max_q, max_kv = mask.shape
    slot = np.arange(B * max_q) if out_index is None else out_index.numpy()
    if dense:  # every key visible to every row (a lone decode step): no need to read the mask
        lo = np.zeros(len(slot), dtype=np.int64)
        hi = np.full(len(slot), max_kv, dtype=np.int64)
    else:
        m = mask.numpy().reshape(B * max_q, max_kv)[slot]
        lo = m.argmax(1)  # first visible key
        hi = lo + m.sum(1)
    rows = np.stack([slot // max_q, lo, hi], axis=1).astype(np.int32)
    work = int((hi - lo).sum()) * num_heads * head_dim
    return RowPlan(torch.from_numpy(rows), PARALLEL_MIN_WORK is not None and work >= PARALLEL_MIN_WORK)


def paged_attention_rows(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, gather_slots: torch.Tensor,
                         plan: RowPlan, scale: float) -> torch.Tensor:
    """q [T, H, D] -> [T, H, D]: row t attends to gather_slots[plan.rows[t, 0], lo:hi) of the pools."""
    return torch.ops.augury_cpu.paged_attention_rows(q.contiguous(), k_pool, v_pool, gather_slots, plan.rows,
                                                     scale, plan.parallel)
