"""Int4 weight-only matmul for few rows (decode M = 1, verify windows M <= 16), in Triton.

At small M the op is a weight stream, so the kernel here is built around reading the
packed weight once, coalesced, and keeping the dequantize arithmetic small. Measured on
the H200 (docs/data/kernels-h200.json, llama3-8b linears, group 32): at M = 16 it is
1.4-2.0x faster than tinygemm (`_weight_int4pack_mm`, whose cost grows with M); at M = 4
0.7-0.8x and at M = 1 0.67-0.92x of tinygemm (22-41% of HBM bandwidth, tinygemm 32-47%):
decode (M = 1) should stay on tinygemm until this path is faster there.

Convention (tinygemm's, as in `augury.layers.quant_linear`): w = (q - 8) * scale + zero,
q in 0..15, one (scale, zero) per `group_size` input columns of an output row.

Layout, built once at load time by `pack` (`Int4Packed`):
- qweight [ceil(K / group) * group / 8, N] int32: nibble i (bits 4i..4i+3) of word w in
  column n is q[n, 8w + i]. K-major words so a tile of 8 * BK_W input columns x BLOCK_N
  outputs is BK_W contiguous rows of 4 * BLOCK_N bytes (coalesced 16-byte loads).
- scale, zero [G, N] in the activation dtype (bf16: what tinygemm stores too).

Per tile, nibble i of every word is turned into float q - 8 with a logic op and an add
(no int-to-float conversion). M = 1 runs on CUDA cores: each thread accumulates
sum_i (q_i - 8) x_i per word and applies the word's group scale and zero once per word
(y += s * sum((q - 8) x) + z * sum(x)); the reduction across words happens once, after the
K loop. More rows dequantize w = (q - 8) s + z and run 8 tensor-core dots per tile, dot i
over the columns 8w + i of x and of the weight (a permutation of K inside the tile, so the
nibbles never need reordering in registers). Long K is split over programs (split-K) when
N alone cannot fill the GPU; partial sums go to a float32 buffer reduced in a fixed order by
a second kernel (deterministic, no atomics). Launch parameters depend on (N, K) and on the
path (M = 1 or not) only, so a row's result does not depend on how many rows share the call
beyond that switch.
Written so it also runs under TRITON_INTERPRET=1 on the CPU (tests).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl

from augury.layers.triton_splitkv import sm_count

MAX_ROWS = 16  # decode and verify widths; prefill-sized inputs take tinygemm / dense matmul
GROUP_SIZES = (32, 64, 128, 256)
_ACT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


@dataclass(frozen=True)
class Int4Packed:
    qweight: torch.Tensor  # [Kp / 8, N] int32, Kp = K rounded up to whole groups
    scale: torch.Tensor  # [G, N]
    zero: torch.Tensor  # [G, N], tinygemm convention (value at q = 8)
    n: int
    k: int
    group_size: int

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.qweight, self.scale, self.zero))


def pack(q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, group_size: int,
         dtype: torch.dtype = torch.bfloat16, device: torch.device | str | None = None) -> Int4Packed:
    """q [N, K] (0..15), scale/zero [N, G] -> Int4Packed on `device` (default: q's). Once, at load."""
    if group_size not in GROUP_SIZES:
        raise ValueError(f"int4 group_size must be one of {GROUP_SIZES}, got {group_size}")
    n, k = q.shape
    g = -(-k // group_size)
    if scale.shape != (n, g) or zero.shape != (n, g):
        raise ValueError(f"scale/zero must be [{n}, {g}] for q [{n}, {k}] at group {group_size}")
    device = torch.device(device) if device is not None else q.device
    kp = g * group_size
    qp = torch.zeros(n, kp, dtype=torch.int64, device=q.device)  # padded columns meet x = 0
    qp[:, :k] = q.to(torch.int64)
    nib = qp.view(n, kp // 8, 8) << (4 * torch.arange(8, device=q.device))
    words = nib.sum(-1)  # < 2^32: fits int64, reinterpreted as int32 below
    words = torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)
    return Int4Packed(
        qweight=words.T.contiguous().to(device),
        scale=scale.T.to(dtype).contiguous().to(device),
        zero=zero.T.to(dtype).contiguous().to(device),
        n=n, k=k, group_size=group_size,
    )


def supported(x: torch.Tensor, packed: Int4Packed | None = None) -> bool:
    """True when `int4_linear` runs this input: a CUDA (or interpreted) tensor of <= MAX_ROWS rows."""
    on_device = x.device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"
    rows = x.numel() // max(1, x.shape[-1])
    ok = on_device and x.dtype in _ACT_DTYPES and 1 <= rows <= MAX_ROWS
    if packed is not None:
        ok = ok and x.shape[-1] == packed.k and packed.qweight.device == x.device
    return ok


@triton.jit
def _nibble(p, i: tl.constexpr):
    """Nibble i of each int32 word as float32 q - 8, exactly: or-ing q into the mantissa of
    2^23 and subtracting (2^23 + 8) replaces an int-to-float conversion (a quarter-rate
    instruction on Hopper) with a logic op and an add."""
    f = (((p >> (4 * i)) & 15) | 0x4B000000).to(tl.float32, bitcast=True)
    return f - 8388616.0


@triton.jit
def _int4_mm_kernel(
    x_ptr, w_ptr, s_ptr, z_ptr, y_ptr, part_ptr,
    M, N, K, KW, G, k_per_split, s_xm, s_ym,
    GS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    USE_DOT: tl.constexpr, SPLIT: tl.constexpr,
):
    BKW: tl.constexpr = BLOCK_K // 8  # packed words (rows of qweight) per tile
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < N
    offs_w = tl.arange(0, BKW)
    k_lo = pid_k * k_per_split
    k_hi = tl.minimum(k_lo + k_per_split, KW * 8)
    if USE_DOT:
        offs_m = tl.arange(0, BLOCK_M)
        m_ok = offs_m < M
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    else:
        acc2 = tl.zeros([BKW, BLOCK_N], dtype=tl.float32)  # reduced over words once, after the loop
    for k0 in range(k_lo, k_hi, BLOCK_K):
        wrow = k0 // 8 + offs_w
        w_ok = (wrow < KW)[:, None] & n_ok[None, :]
        p = tl.load(w_ptr + wrow[:, None] * N + offs_n[None, :], mask=w_ok, other=0)  # [BKW, BN] int32
        g = (wrow * 8) // GS  # each word's 8 columns share one group
        s = tl.load(s_ptr + g[:, None] * N + offs_n[None, :], mask=w_ok, other=0.0).to(tl.float32)
        z = tl.load(z_ptr + g[:, None] * N + offs_n[None, :], mask=w_ok, other=0.0).to(tl.float32)
        kcol = k0 + offs_w * 8  # column of nibble 0 of each word
        if USE_DOT:
            # K permuted inside the tile: dot i takes columns 8w + i of x and of the weight
            for i in tl.static_range(8):
                w = _nibble(p, i) * s + z  # [BKW, BN]
                x = tl.load(x_ptr + offs_m[:, None] * s_xm + (kcol + i)[None, :],
                            mask=m_ok[:, None] & (kcol + i < K)[None, :], other=0.0)  # [BM, BKW]
                if x.dtype == tl.float32:
                    acc += tl.dot(x, w, input_precision="ieee")
                else:
                    acc += tl.dot(x, w.to(x.dtype))
        else:
            t = tl.zeros([BKW, BLOCK_N], dtype=tl.float32)
            xs = tl.zeros([BKW], dtype=tl.float32)
            for i in tl.static_range(8):
                x = tl.load(x_ptr + kcol + i, mask=kcol + i < K, other=0.0).to(tl.float32)  # [BKW]
                t += _nibble(p, i) * x[:, None]
                xs += x
            acc2 += t * s + z * xs[:, None]  # sum (q - 8) x * scale + zero * sum x, per word
    if USE_DOT:
        out = acc
        rows = offs_m
    else:
        out = tl.sum(acc2, axis=0)[None, :]
        rows = tl.arange(0, 1)
    ok = (rows < M)[:, None] & n_ok[None, :]
    if SPLIT:
        tl.store(part_ptr + (pid_k * M + rows[:, None]) * N + offs_n[None, :], out, mask=ok)
    else:
        tl.store(y_ptr + rows[:, None] * s_ym + offs_n[None, :], out.to(y_ptr.dtype.element_ty), mask=ok)


@triton.jit
def _split_sum_kernel(part_ptr, y_ptr, MN, N, num_splits, s_ym, BLOCK: tl.constexpr):
    """y[m, n] = sum over splits in order (deterministic), cast to y's dtype."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < MN
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for sp in range(0, num_splits):
        acc += tl.load(part_ptr + sp * MN + offs, mask=ok, other=0.0)
    tl.store(y_ptr + (offs // N) * s_ym + offs % N, acc.to(y_ptr.dtype.element_ty), mask=ok)


@dataclass(frozen=True)
class LaunchConfig:
    block_n: int = 128
    block_k: int = 128  # the dot path (M > 1) takes at least 128: 16 words per dot
    num_warps: int = 4
    num_stages: int = 4
    waves: float = 4.0  # split K until the grid covers the GPU this many times over
    min_k_tiles: int = 4  # ...but give each split at least this many K tiles


DEFAULT = LaunchConfig()


def default_config(n: int, k: int, rows: int) -> LaunchConfig:
    """Launch parameters from (N, K) and the path (rows == 1 or not), as swept on the H200
    (docs/data/kernels-h200.json, llama3-8b linears): the timings were flat in num_stages and
    best with many programs on the one-row path; wide N takes wider tiles."""
    wide = n >= 16384
    if rows == 1:
        return LaunchConfig(block_n=128 if wide else 64, block_k=128, num_warps=4, num_stages=4,
                            waves=8 if k <= 8192 else 4)
    if wide:
        return LaunchConfig(block_n=256, block_k=128, num_warps=4, num_stages=3, waves=2)
    return LaunchConfig(block_n=128, block_k=128, num_warps=4, num_stages=4, waves=4)


def _splits(n: int, kp: int, cfg: LaunchConfig, device: torch.device) -> int:
    """Split-K factor from (N, K) alone: the same layer always launches the same grid."""
    n_tiles = -(-n // cfg.block_n)
    k_tiles = -(-kp // cfg.block_k)
    want = max(1, int(cfg.waves * sm_count(device)) // n_tiles)
    return max(1, min(want, k_tiles // cfg.min_k_tiles))


def int4_linear(x: torch.Tensor, packed: Int4Packed, bias: torch.Tensor | None = None,
                cfg: LaunchConfig | None = None, use_dot: bool | None = None, splits: int | None = None) -> torch.Tensor:
    """x [..., K] -> [..., N] in x's dtype; rows <= MAX_ROWS (see `supported`)."""
    lead = x.shape[:-1]
    x2 = x.reshape(-1, packed.k)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    M, N = x2.shape[0], packed.n
    cfg = cfg or default_config(N, packed.k, M)
    kw = packed.qweight.shape[0]
    kp = kw * 8
    gs = packed.group_size
    dot = (M > 1) if use_dot is None else use_dot
    if M > 1 and not dot:
        raise ValueError("the CUDA-core path takes one row; more rows run the dot path")
    block_k = max(cfg.block_k, 128) if dot else cfg.block_k  # tl.dot needs K >= 16 words
    S = splits or _splits(N, kp, replace(cfg, block_k=block_k), x.device)
    k_tiles = -(-kp // block_k)
    per = -(-k_tiles // S) * block_k
    S = -(-kp // per)
    y = torch.empty(M, N, dtype=x.dtype, device=x.device)
    part = torch.empty(S, M, N, dtype=torch.float32, device=x.device) if S > 1 else y
    _int4_mm_kernel[(triton.cdiv(N, cfg.block_n), S)](
        x2, packed.qweight, packed.scale, packed.zero, y, part,
        M, N, packed.k, kw, packed.scale.shape[0], per, x2.stride(0), y.stride(0),
        GS=gs, BLOCK_M=max(16, triton.next_power_of_2(M)), BLOCK_N=cfg.block_n, BLOCK_K=block_k,
        USE_DOT=dot, SPLIT=S > 1, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    if S > 1:
        _split_sum_kernel[(triton.cdiv(M * N, 1024),)](part, y, M * N, N, S, y.stride(0), BLOCK=1024)
    if bias is not None:
        y = y + bias.to(y.dtype)
    return y.view(*lead, N)
