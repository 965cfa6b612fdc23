"""Split-KV (flash-decoding) helpers shared by the paged decode kernels (native pools:
`layers/triton_paged_decode.py`; encoded pools: `kv/codecs/triton_attention.py`).

A long KV range is cut into S splits that run as separate programs; each writes its
partial (running max m, denominator l, unnormalized accumulator) and one merge program
per (request, KV head) combines them, exactly as softmax over the whole range would.

Two ways to merge: a second launch (`merge_splits_kernel`, one program per (request, KV
head)), or inside the same launch ("last program merges": `arrive_last` counts the
programs of a (request, KV head) that have written their partial on a persistent counter
from `split_counters`; the one that arrives last reads all S partials back in split order
(`merge_partials`, so the result does not depend on which program finished last), writes
the output rows and puts the counter back to 0 for the next launch / graph replay).
"""

from __future__ import annotations

import functools
import threading

import torch
import triton
import triton.language as tl


@functools.lru_cache(maxsize=8)
def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device (1 elsewhere: the interpreter)."""
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 1


def num_splits_for(batch_kv_heads: int, max_kv: int, block_n: int, device: torch.device,
                   waves: float = 2.0, min_tiles: int = 2) -> int:
    """Splits so the grid covers the GPU `waves` times over, each split over >= `min_tiles`
    key tiles. A function of shapes only: the same step always launches the same grid."""
    return splits_for_sms(batch_kv_heads, max_kv, block_n, sm_count(device), waves, min_tiles)


def splits_for_sms(batch_kv_heads: int, max_kv: int, block_n: int, sms: int, waves: float = 2.0,
                   min_tiles: int = 2) -> int:
    """`num_splits_for` on a GPU of `sms` multiprocessors (pure: integers in, integer out)."""
    target = int(waves * sms)
    want = max(1, -(-target // batch_kv_heads))
    most = max(1, -(-max_kv // (min_tiles * block_n)))
    return min(want, most)


def split_plan(max_kv: int, splits: int, block_n: int) -> tuple[int, int]:
    """(number of splits, keys per split): whole tiles per split, no empty split."""
    split_len = -(-max_kv // splits)
    split_len = -(-split_len // block_n) * block_n
    return -(-max_kv // split_len), split_len


def partials(out: torch.Tensor, num_kv_heads: int, splits: int, block_m: int, block_d: int):
    """(acc, m, l) buffers for `splits` partials per (request, KV head); with one split the
    kernel writes `out` directly and these are unused placeholders."""
    if splits == 1:
        return out, out, out
    B = out.shape[0]
    acc = torch.empty((B, num_kv_heads, splits, block_m, block_d), dtype=torch.float32, device=out.device)
    m = torch.empty((B, num_kv_heads, splits, block_m), dtype=torch.float32, device=out.device)
    return acc, m, torch.empty_like(m)


@triton.jit
def merge_splits_kernel(
    acc_ptr, m_ptr, l_ptr, o_ptr, num_splits, max_q, s_ob, s_oj, s_oh,
    HKV: tl.constexpr, REP: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """Partials of one (request, kv head) -> its rows of o [B, max_q, H, D], in o's dtype."""
    b = tl.program_id(0)
    h = tl.program_id(1)
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    base = (b * HKV + h) * num_splits
    mx = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)
    for sp in range(0, num_splits):
        mx = tl.maximum(mx, tl.load(m_ptr + (base + sp) * BLOCK_M + offs_m))
    num = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    den = tl.zeros([BLOCK_M], dtype=tl.float32)
    for sp in range(0, num_splits):
        w = tl.exp(tl.load(m_ptr + (base + sp) * BLOCK_M + offs_m) - mx)  # a split with no visible key weighs 0
        den += w * tl.load(l_ptr + (base + sp) * BLOCK_M + offs_m)
        num += w[:, None] * tl.load(acc_ptr + ((base + sp) * BLOCK_M + offs_m[:, None]) * BLOCK_D + offs_d[None, :])
    o = num / tl.maximum(den, 1.0e-30)[:, None]
    j = offs_m // REP
    head = h * REP + offs_m % REP
    ok = (offs_m < max_q * REP)[:, None] & (offs_d < D)[None, :]
    tl.store(o_ptr + b * s_ob + j[:, None] * s_oj + head[:, None] * s_oh + offs_d[None, :],
             o.to(o_ptr.dtype.element_ty), mask=ok)


# ------------------------------------------------------------------ merge in the same launch

_COUNTERS: dict[tuple[torch.device, str], torch.Tensor] = {}
_RETIRED: list[torch.Tensor] = []  # outgrown counter buffers: captured CUDA graphs may still hold them
_COUNTERS_LOCK = threading.Lock()
MIN_COUNTERS = 8192  # int32 each (32 KB); the default split choice needs B x Hkv < 2 x SMs of them


def split_counters(device: torch.device, n: int = 0, owner: str = "attention") -> torch.Tensor | None:
    """The zeroed int32 arrival counters (>= n of them, one per (request, KV head)) that
    `arrive_last` uses on `device`, or None when there are fewer than n and a CUDA graph is
    being captured on the current stream (the caller then merges with a second launch or
    another fallback). `owner` names a separate buffer for another kind of kernel
    (`layers/triton_argmax.py`), so two kernels never count on the same cells.

    Persistent by design: each launch leaves them at 0 again, so a captured graph can
    replay; they are created (zeroed) outside any capture, cached per device, grown by
    replacing the buffer, and never freed (an outgrown buffer stays alive in `_RETIRED`,
    since graphs captured earlier keep its address). One buffer per (device, owner): two
    launches that use it must not run at the same time (e.g. on two streams at once)."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    key = (device, owner)
    buf = _COUNTERS.get(key)
    if buf is not None and buf.numel() >= n:
        return buf
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return None
    with _COUNTERS_LOCK:
        buf = _COUNTERS.get(key)
        if buf is None or buf.numel() < n:
            if buf is not None:
                _RETIRED.append(buf)
            size = max(MIN_COUNTERS, triton.next_power_of_2(max(1, n)))
            buf = _COUNTERS[key] = torch.zeros(size, dtype=torch.int32, device=device)
        return buf


def merge_chunk(splits: int, rows: int, block_d: int, num_warps: int) -> int:
    """Splits `merge_partials` loads at once: a power of 2, at most next_power_of_2(splits),
    the [chunk, rows, block_d] float32 tile within ~64 registers per thread."""
    budget = max(1, (64 * 32 * num_warps) // (rows * block_d))
    chunk = 1
    while chunk * 2 <= budget and chunk < splits:
        chunk *= 2
    return chunk


@triton.jit
def arrive_last(counter_ptr, num_splits):
    """Call after storing this program's partial: -> true in the program of its (request,
    KV head) that arrived last (all num_splits partials are then visible to it).

    The barrier makes every thread's partial stores precede the arrival; the counter add
    is acq_rel at GPU scope (release: this program's stores are published with it;
    acquire: the last one sees every earlier program's). Triton broadcasts a scalar
    atomic's result to the whole program; the second barrier orders the merge's loads
    after the acquire in every thread."""
    tl.debug_barrier()
    old = tl.atomic_add(counter_ptr, 1, sem="acq_rel", scope="gpu")
    tl.debug_barrier()
    return old == num_splits - 1


@triton.jit
def release_counter(counter_ptr):
    """The last program puts its counter back to 0 (every other program has arrived already)."""
    tl.atomic_xchg(counter_ptr, 0, sem="relaxed", scope="gpu")


@triton.jit
def merge_partials(acc_ptr, m_ptr, l_ptr, base, num_splits, rows,
                   BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, D: tl.constexpr,
                   ROWS: tl.constexpr, SPLITS: tl.constexpr, CHUNK: tl.constexpr):
    """Partials base .. base + num_splits - 1 (layout of `partials`, first `rows` rows valid;
    SPLITS = next_power_of_2(num_splits)) -> the normalized output rows [ROWS, BLOCK_D] float32.

    Always the same order whatever the arrival order: the row maxima and denominators of all
    splits in one load, then the accumulators in chunks of CHUNK splits in split order, each
    chunk summed over its splits by one fixed reduction. The chunk loads do not wait on the
    sums (the weights come from the maxima), so the loop can prefetch. Loads bypass L1 (.cg):
    the partials were written by other programs of this launch."""
    offs_r = tl.arange(0, ROWS)
    offs_d = tl.arange(0, BLOCK_D)
    offs_s = tl.arange(0, SPLITS)
    offs_c = tl.arange(0, CHUNK)
    r_ok = offs_r < rows
    d_ok = offs_d < D
    ok_all = (offs_s < num_splits)[:, None] & r_ok[None, :]
    row_all = (base + offs_s)[:, None] * BLOCK_M + offs_r[None, :]
    m_all = tl.load(m_ptr + row_all, mask=ok_all, other=-1.0e30, cache_modifier=".cg")  # [S, R]
    l_all = tl.load(l_ptr + row_all, mask=ok_all, other=0.0, cache_modifier=".cg")
    if CHUNK >= SPLITS:
        # one chunk holds every split: all loads are issued before any is used (one L2 round trip;
        # the loop below, pipelined after the maxima's use, took two). The same values and sums as
        # the loop's single pass: w from the maxima already loaded, one sum over [SPLITS, R, D].
        a_all = tl.load(acc_ptr + row_all[:, :, None] * BLOCK_D + offs_d[None, None, :],
                        mask=ok_all[:, :, None] & d_ok[None, None, :], other=0.0, cache_modifier=".cg")
        mx = tl.max(m_all, axis=0)  # [R]
        w_all = tl.exp(m_all - mx[None, :])
        den = tl.sum(w_all * l_all, axis=0)  # a split with no visible key weighs 0
        num = tl.zeros([ROWS, BLOCK_D], dtype=tl.float32) + tl.sum(w_all[:, :, None] * a_all, axis=0)  # as the loop's
        return num / tl.maximum(den, 1.0e-30)[:, None]
    mx = tl.max(m_all, axis=0)  # [R]
    den = tl.sum(tl.exp(m_all - mx[None, :]) * l_all, axis=0)  # a split with no visible key weighs 0
    num = tl.zeros([ROWS, BLOCK_D], dtype=tl.float32)
    for s0 in tl.range(0, num_splits, CHUNK, num_stages=2):
        sp = s0 + offs_c
        ok2 = (sp < num_splits)[:, None] & r_ok[None, :]  # [C, R]
        row = (base + sp)[:, None] * BLOCK_M + offs_r[None, :]
        w = tl.exp(tl.load(m_ptr + row, mask=ok2, other=-1.0e30, cache_modifier=".cg") - mx[None, :])
        a_c = tl.load(acc_ptr + row[:, :, None] * BLOCK_D + offs_d[None, None, :],
                      mask=ok2[:, :, None] & d_ok[None, None, :], other=0.0, cache_modifier=".cg")
        num += tl.sum(w[:, :, None] * a_c, axis=0)
    return num / tl.maximum(den, 1.0e-30)[:, None]
