"""Few-query attention for eager CPU steps: one-token decodes (attend_decode_cpu) and, row by row,
verify windows and batches with bitwise batch invariance (attend_rows_cpu). See layers/attention.py."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import torch

if TYPE_CHECKING:
    from augury.layers.attention import GroupAttnMeta

Reader = Callable[[torch.Tensor], torch.Tensor]  # flat slots [S] -> rows [S, Hkv, D]

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


def attend_decode_cpu(q: torch.Tensor, read_k: Reader, read_v: Reader, gmeta: "GroupAttnMeta",
                      scale: float) -> torch.Tensor:
    """One query per request, q [B, H, D] -> [B, H, D] (CPU; GPUs keep SDPA's decode kernels)."""
    return _one_thread(lambda: _attend_decode(q, read_k, read_v, gmeta, scale))


def _attend_decode(q: torch.Tensor, read_k: Reader, read_v: Reader, gmeta: "GroupAttnMeta",
                   scale: float) -> torch.Tensor:
    """Two batched matmuls and a softmax, with the query heads grouped under their KV head
    (GQA without repeating K/V): for one row SDPA's kernel setup costs more than the math."""
    B, H, D = q.shape
    kc, vc = _gathered_kv(q, read_k, read_v, gmeta)
    Hkv = kc.shape[1]
    if B == 1 and gmeta.dense:  # a lone request reading every key: the shared one-row path
        return _attend_one(q.view(Hkv, H // Hkv, D), kc[0], vc[0], kc.shape[-1], scale, q.dtype).view(1, H, D)
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


def _attend_one(q: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, n: int, scale: float,
                dtype: torch.dtype) -> torch.Tensor:
    """One query row, its heads grouped under their KV head: q [Hkv, rep, D] over the first n keys
    of kc [Hkv, D, max_kv] / vc [Hkv, max_kv, D] -> [Hkv, rep, D]. The one computation both a lone
    decode step and every row of a window run, so their bits agree. bmm on 3-D views, not
    torch.matmul: its broadcasting wrapper cost ~3.5 of ~25 µs per row (same kernel underneath)."""
    s = torch.bmm(q, kc.narrow(2, 0, n)).mul_(scale)  # [Hkv, rep, n]
    return torch.bmm(_softmax(s, dtype), vc.narrow(1, 0, n))


def _softmax(s: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Softmax over keys, in float32 for half-precision scores (as HF does)."""
    return torch.softmax(s, dim=-1) if s.dtype == torch.float32 else torch.softmax(s, -1, dtype=torch.float32).to(dtype)


def _row_plan(gmeta: "GroupAttnMeta") -> list[tuple[int, int, int]]:
    """(flat row, request, visible key count) per real query row, read once per step from the
    mask (host copy cached on the metadata: every layer of the group shares it)."""
    plan = getattr(gmeta, "_row_plan", None)
    if plan is None:
        B, Q = gmeta.num_seqs, gmeta.max_q
        lens = gmeta.mask[:, 0].sum(-1).tolist()  # [B][Q]: causal prefix length of each padded row
        slots = gmeta.out_index.tolist() if gmeta.out_index is not None else range(B * Q)
        plan = [(t, s // Q, int(lens[s // Q][s % Q])) for t, s in enumerate(slots)]
        gmeta._row_plan = plan
    return plan


def attend_rows_cpu(q: torch.Tensor, read_k: Reader, read_v: Reader, gmeta: "GroupAttnMeta",
                    scale: float) -> torch.Tensor:
    """Full-attention rows, each computed exactly as a one-token decode step computes it: q [T, H, D] -> [T, H, D].

    Batch invariance: row j of a verify window (or of a batch) attends to its own causal prefix
    of L keys through matmuls of the same shapes, strides and alignment as `attend_decode_cpu`
    on a step where that row is alone (keys [0, L) read unpadded, dense) — so the bits match.
    A padded formulation cannot promise that: BLAS kernels regroup a dot product's terms when
    the row count, batch count or contraction length changes (measured: MKL sgemm rows differ
    once M or the batch grows), and SDPA blocks its online softmax by both lengths.
    Costs ~4 small ops per row instead of one SDPA call per segment: meant for verify windows
    (a few rows), not prefill. Sliding windows are not covered (their first gathered block
    depends on the step's first token, so a row's key range shifts with the window)."""
    if gmeta.window is not None:
        raise ValueError("attend_rows_cpu is for full-attention layers")
    return _one_thread(lambda: _attend_rows(q, read_k, read_v, gmeta, scale))


def _attend_rows(q: torch.Tensor, read_k: Reader, read_v: Reader, gmeta: "GroupAttnMeta",
                 scale: float) -> torch.Tensor:
    T, H, D = q.shape
    # the decode path's layouts, made once: per row only the key count is narrowed
    kc, vc = _gathered_kv(q, read_k, read_v, gmeta)
    Hkv = kc.shape[1]
    qg = q.view(T, Hkv, H // Hkv, D)
    rows = [_attend_one(qg[t], kc[b], vc[b], n, scale, q.dtype) for t, b, n in _row_plan(gmeta)]
    return torch.stack(rows).view(T, H, D)
