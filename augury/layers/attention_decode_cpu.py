"""Few-query attention for eager CPU steps: one-token decodes (attend_decode_cpu) and verify windows
and small batches with bitwise batch invariance (attend_rows_cpu). See layers/attention.py.

This is the torch fallback: when augury's native CPU kernels are loaded, steps over plain pools run
augury/cpu_kernels/attention.cpp instead (layers/attention.py `attend_native_cpu`), which is batch
invariant by construction; this module still serves encoded KV codecs and machines without the library.

How a row is computed (a lone decode step and every row of a window alike): its L visible keys are
gathered newest first and padded to N = round_up(L, BUCKET) with copies of its oldest key; scores
are one bmm of per-entry shape [rep, D] x [D, N] (one entry per KV head), scaled, the N - L padded
keys masked by adding -inf, a softmax over N, and a bmm with V of shape [N, D]. BLAS kernels change
a dot product's term grouping with the entry's M, N or K, never with the batch count nor with
where the entry sits in a batch (measured; the invariance tests hold it), so a row's bits depend
only on its own query, keys and L.

Why newest first: a request's rows j = 0..T-1 of a window see L_j = nc + j + 1 keys. In one buffer
holding the request's keys newest first, row j's own key sequence starts T - 1 - j keys in. So the
K operand of every row whose N falls in the same bucket is one strided view of that buffer, entry
(row, head) starting D elements after the previous one: all those rows run as ONE bmm pair of
batch rows x Hkv, with no per-row copy of K/V (a copy of ~240 kB per row at 300 keys costs more
than the ops it saves). Rows of different requests, or of different buckets, are separate groups.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

import numpy as np
import torch

if TYPE_CHECKING:
    from augury.layers.attention import GroupAttnMeta

Reader = Callable[[torch.Tensor], torch.Tensor]  # flat slots [S] -> rows [S, Hkv, D]

# Key counts are padded to a multiple of this: a lone decode step pays for up to BUCKET - 1 masked
# keys; a verify window whose rows straddle a multiple of it runs as two bmm groups, not one.
# 16 is also AVX-512's float width, so softmax and the matmuls never take a ragged tail.
BUCKET = 16

# Run these few-query ops on the calling thread alone. Each tiny bmm / softmax would otherwise
# open an OpenMP region (torch splits the batch of KV heads across threads), and with 2 cores
# shared with other work every region is a barrier that can wait out a time slice: measured
# 100+ ms/token at 2 threads vs 17 ms at 1 under load. One thread also fixes the kernels'
# work split, so a row's bits cannot depend on the engine's thread count.
SINGLE_THREADED = True


def _one_thread(fn: Callable[[], torch.Tensor]) -> torch.Tensor:
    n = torch.get_num_threads()
    if n == 1 or not SINGLE_THREADED:
        return fn()
    torch.set_num_threads(1)
    try:
        return fn()
    finally:
        torch.set_num_threads(n)


def _round_up(n: int) -> int:
    return -(-n // BUCKET) * BUCKET


@dataclass
class RowGroup:
    """Rows of one request, in entry order (longest first, key counts consecutive), whose key
    counts round up to the same N: one bmm pair over rows x Hkv entries."""

    first: int  # first entry-order row
    rows: int
    keys: int  # N
    start: int  # key position (in the gathered buffers) where the group's first row reads its newest key
    top: int  # key count L of the group's first row; row r of the group sees top - r keys


@dataclass
class RowPlan:
    """Host-side, once per step (every layer of the group shares it)."""

    slots: torch.Tensor  # [P] long: pool slots of each request's keys, newest first, padded with its oldest
    groups: list[RowGroup]
    order: torch.Tensor | None  # [T] long: flat row of each entry-order row; None when they agree
    inverse: torch.Tensor | None  # [T] long: entry-order row of each flat row
    max_len: int  # longest key count of any row
    _bias: dict[tuple[torch.dtype, int], list[torch.Tensor]] = field(default_factory=dict, repr=False)

    def bias(self, dtype: torch.dtype, hkv: int) -> list[torch.Tensor]:
        """Per group, the 0 / -inf mask of its scores, broadcastable to [rows * hkv, rep, N]: strided
        views of one template (row r of a group, top - r keys, reads it one element further in than
        row r - 1), repeated per KV head when a group has several rows."""
        out = self._bias.get((dtype, hkv))
        if out is None:
            z = torch.zeros(self.max_len + BUCKET, dtype=dtype)
            z[self.max_len:] = float("-inf")
            out = []
            for g in self.groups:
                b = z.as_strided((g.rows, 1, g.keys), (1, g.keys, 1), self.max_len - g.top)
                out.append(b if g.rows == 1 else b.repeat_interleave(hkv, 0))
            self._bias[(dtype, hkv)] = out
        return out


def _make_plan(gmeta: "GroupAttnMeta", rows: list[tuple[int, int, int]]) -> RowPlan:
    """rows: (flat row, request, visible key count) per query row; a request's rows see
    consecutive prefixes of its gathered keys [0, L)."""
    width = gmeta.gather_slots.shape[1]
    by_req: dict[int, list[tuple[int, int]]] = {}
    for t, b, n in rows:
        by_req.setdefault(b, []).append((n, t))
    groups: list[RowGroup] = []
    order: list[int] = []
    index: list[np.ndarray] = []
    base = 0  # key position where the request's buffer starts
    for b, rs in by_req.items():
        rs.sort(reverse=True)  # longest first: each next row starts one key further in
        ctx = rs[0][0]
        span = 0
        for n, t in rs:
            keys, start = _round_up(n), base + ctx - n
            g = groups[-1] if groups and groups[-1].start >= base else None
            if g is not None and g.keys == keys and g.top - g.rows == n:
                g.rows += 1
            else:
                groups.append(RowGroup(len(order), 1, keys, start, n))
            order.append(t)
            span = max(span, ctx - n + keys)
        index.append(b * width + np.maximum(np.arange(ctx - 1, ctx - 1 - span, -1), 0))
        base += span
    flat = torch.from_numpy(np.concatenate(index)) if len(index) > 1 else torch.from_numpy(index[0])
    slots = gmeta.gather_slots.view(-1).index_select(0, flat.to(gmeta.gather_slots.device))
    same = order == list(range(len(order)))
    dev = gmeta.gather_slots.device
    perm = None if same else torch.tensor(order, device=dev)
    inv = None if same else torch.empty_like(perm).scatter_(0, perm, torch.arange(len(order), device=dev))
    return RowPlan(slots, groups, perm, inv, max(n for _, _, n in rows))


def _lone_plan(gmeta: "GroupAttnMeta") -> RowPlan:
    """A one-token step reading every gathered key (dense): one row, one request."""
    plan = getattr(gmeta, "_row_plan", None)
    if plan is None:
        plan = _make_plan(gmeta, [(0, 0, int(gmeta.gather_slots.shape[1]))])
        gmeta._row_plan = plan
    return plan


def _row_plan(gmeta: "GroupAttnMeta") -> RowPlan:
    """The plan of a window / batch step, read once per step from the mask (cached on the
    metadata: every layer of the group shares it; the compiled-graph op carries it across layers)."""
    plan = getattr(gmeta, "_row_plan", None)
    if plan is None:
        B, Q = gmeta.num_seqs, gmeta.max_q
        lens = gmeta.mask[:, 0].sum(-1).tolist()  # [B][Q]: causal prefix length of each padded row
        slots = gmeta.out_index.tolist() if gmeta.out_index is not None else range(B * Q)
        plan = _make_plan(gmeta, [(t, s // Q, int(lens[s // Q][s % Q])) for t, s in enumerate(slots)])
        gmeta._row_plan = plan
    return plan


def _attend_planned(q: torch.Tensor, read_k: Reader, read_v: Reader, plan: RowPlan, scale: float) -> torch.Tensor:
    """q [T, H, D] (flat rows) -> [T, H, D], every row computed as its own one-token step."""
    T, H, D = q.shape
    kb, vb = read_k(plan.slots), read_v(plan.slots)  # [P, Hkv, D]
    if kb.dtype != q.dtype:
        kb, vb = kb.to(q.dtype), vb.to(q.dtype)
    kb, vb = kb.contiguous(), vb.contiguous()
    Hkv = kb.shape[1]
    rep, step = H // Hkv, Hkv * D  # step: elements from one key position to the next
    qe = (q if plan.order is None else q.index_select(0, plan.order)).reshape(T * Hkv, rep, D)
    biases = plan.bias(q.dtype, Hkv)
    one = len(plan.groups) == 1
    out = None if one else torch.empty_like(qe)
    for g, bias in zip(plan.groups, biases):
        e0, e1, n = g.first * Hkv, (g.first + g.rows) * Hkv, g.keys
        # entry (row r, head h) starts at key position start + r, head h: D elements per entry
        k = kb.as_strided((e1 - e0, D, n), (D, 1, step), kb.storage_offset() + g.start * step)
        v = vb.as_strided((e1 - e0, n, D), (D, step, 1), vb.storage_offset() + g.start * step)
        # scaled scores with each row's padded keys masked: bias + scale * (q @ k), one op
        s = torch.baddbmm(bias, qe[e0:e1], k, alpha=scale)  # [rows * Hkv, rep, N]
        if one:
            out = torch.bmm(_softmax(s, q.dtype), v)
        else:
            torch.bmm(_softmax(s, q.dtype), v, out=out[e0:e1])
    out = out.view(T, H, D)
    return out if plan.inverse is None else out.index_select(0, plan.inverse)


def attend_decode_cpu(q: torch.Tensor, read_k: Reader, read_v: Reader, gmeta: "GroupAttnMeta",
                      scale: float) -> torch.Tensor:
    """One query per request, q [B, H, D] -> [B, H, D] (CPU; GPUs keep SDPA's decode kernels)."""
    if q.shape[0] == 1 and gmeta.dense:  # a lone request reading every key: the shared row computation
        return _one_thread(lambda: _attend_planned(q, read_k, read_v, _lone_plan(gmeta), scale))
    return _one_thread(lambda: _attend_decode(q, read_k, read_v, gmeta, scale))


def _attend_decode(q: torch.Tensor, read_k: Reader, read_v: Reader, gmeta: "GroupAttnMeta",
                   scale: float) -> torch.Tensor:
    """Larger decode batches: two batched matmuls and a softmax over the padded keys, with the
    query heads grouped under their KV head (GQA without repeating K/V): for few rows SDPA's
    kernel setup costs more than the math. Not batch invariant (see attend_rows_cpu)."""
    B, H, D = q.shape
    kc, vc = _gathered_kv(q, read_k, read_v, gmeta)
    Hkv = kc.shape[1]
    # HF repeat_kv order: query head h reads KV head h // (H // Hkv)
    s = torch.matmul(q.view(B, Hkv, H // Hkv, D), kc).mul_(scale)  # [B, Hkv, rep, max_kv]
    if not gmeta.dense:
        s.add_(gmeta.additive_mask(q.dtype))  # [B, 1, 1, max_kv] broadcasts over heads
    return torch.matmul(_softmax(s, q.dtype), vc).view(B, H, D)


def _gathered_kv(q: torch.Tensor, read_k: Reader, read_v: Reader,
                 gmeta: "GroupAttnMeta") -> tuple[torch.Tensor, torch.Tensor]:
    """Every request's gathered keys and values in the decode matmuls' layouts, q's dtype:
    K [B, Hkv, D, max_kv], V [B, Hkv, max_kv, D]."""
    B, D = gmeta.num_seqs, q.shape[-1]
    flat = gmeta.gather_slots.view(-1)
    kc = read_k(flat)  # [B * max_kv, Hkv, D]
    vc = read_v(flat)
    Hkv = kc.shape[1]
    if kc.dtype != q.dtype:
        kc, vc = kc.to(q.dtype), vc.to(q.dtype)
    return kc.view(B, -1, Hkv, D).permute(0, 2, 3, 1), vc.view(B, -1, Hkv, D).transpose(1, 2)


def _softmax(s: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Softmax over keys, in float32 for half-precision scores (as HF does)."""
    return torch.softmax(s, dim=-1) if s.dtype == torch.float32 else torch.softmax(s, -1, dtype=torch.float32).to(dtype)


def attend_rows_cpu(q: torch.Tensor, read_k: Reader, read_v: Reader, gmeta: "GroupAttnMeta",
                    scale: float) -> torch.Tensor:
    """Full-attention rows, each computed exactly as a one-token decode step computes it: q [T, H, D] -> [T, H, D].

    Batch invariance: row j of a verify window (or of a batch) attends to its own causal prefix of
    L keys through the per-entry matmul shapes, key order and padding that `attend_decode_cpu`
    uses on a step where that row is alone (module docstring), so the bits match. Rows of one
    request in one key-count bucket share a bmm pair. A padded formulation of the usual kind
    cannot promise that: BLAS kernels regroup a dot product's terms when the row count or
    contraction length changes, and SDPA blocks its online softmax by both lengths.
    Meant for verify windows and small batches, not prefill. Sliding windows are not covered (their
    first gathered block depends on the step's first token, so a row's key range shifts with the
    window)."""
    if gmeta.window is not None:
        raise ValueError("attend_rows_cpu is for full-attention layers")
    return _one_thread(lambda: _attend_planned(q, read_k, read_v, _row_plan(gmeta), scale))
