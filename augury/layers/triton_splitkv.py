"""Split-KV (flash-decoding) helpers shared by the paged decode kernels (native pools:
`layers/triton_paged_decode.py`; encoded pools: `kv/codecs/triton_attention.py`).

A long KV range is cut into S splits that run as separate programs; each writes its
partial (running max m, denominator l, unnormalized accumulator) and one merge program
per (request, KV head) combines them, exactly as softmax over the whole range would.
"""

from __future__ import annotations

import functools

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
    target = int(waves * sm_count(device))
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
