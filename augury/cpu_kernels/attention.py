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

# Split the call's (row, query head) units over torch's threads when a call has at least this much
# work (sum over rows of keys x query heads x head dim), or never when None. A decode step finds the
# KV pools cold (the layer's weights streamed through the caches since the last step), so a layer's
# attention is memory-latency bound on one thread: a second thread keeping its own misses in flight
# took SmolLM2's 30 layers at 256 keys (float32 pools, 2-core AVX2 host) from ~129 to ~97 us a layer,
# and decode from 72 to 76 tok/s (medians of 4, alternating in one process). Below ~64 keys a layer's
# attention is a few microseconds and the barrier is not worth it. The risk, as for the int4
# products' own split: a thread descheduled by another job on the same cores makes the barrier wait
# out its time slice (measured earlier: 50 us -> 12 ms). The result is bitwise the same either way.
PARALLEL_MIN_WORK: int | None = 32768


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
