"""The elementwise steps of a many-row GPU forward (prefill, verify) in one launch each, in Triton.

Eager torch runs `silu(gate) * up` over the fused gate/up output as two kernels on its strided halves
(torch's non-vectorized elementwise path), and rope's `x * cos + roll(x, D/2) * sin` as four more
(the roll, two broadcast products, the sum), and RMSNorm's `weight * h` through its strided broadcast
path. In a bf16 1k-token Llama-3-8B prefill on the H200 those took ~5 ms of ~28 ms of kernels
(`docs/data/gpu27/call1-prefill1.log`); here each is one pass that reads its inputs once and writes its
output once.

Bitwise torch's eager bf16 result: every op rounds to bf16 where torch's does (`triton_gemv._rnd`,
integer rounding the compiler cannot fold away). A product of two bf16 values is exact in float32,
so one rounding after it is what torch's float32 opmath gives, and sums round as torch's do. silu is
torch's CUDA formula, x / (1 + exp(-x)) in float32 with IEEE division and libdevice's expf (the
interpreter, which has no libdevice, uses numpy's exp). Only bf16 takes these kernels: fp16's
rounding would be a cast round trip the compiler may drop, and fp32's products an FMA it may form.
Written so it also runs under TRITON_INTERPRET=1 (tests).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from augury.layers.triton_gemv import _rnd, _rotate_halves

ROW_BLOCK = 1024  # columns of one row a program takes (silu_mul, mul_rows)


def _on_device(t: torch.Tensor) -> bool:
    return t.device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"


def silu_mul_supported(gu: torch.Tensor) -> bool:
    """gu [T, 2I] bf16 with unit column stride, on a CUDA device (or the interpreter)."""
    return (_on_device(gu) and gu.dim() == 2 and gu.dtype == torch.bfloat16 and gu.stride(-1) == 1
            and gu.shape[1] % 2 == 0 and gu.shape[0] > 0)


def mul_rows_supported(h: torch.Tensor, w: torch.Tensor) -> bool:
    """h [T, D] bf16 with unit column stride and w [D] bf16 contiguous, on a CUDA device (or the interpreter)."""
    return (_on_device(h) and h.dim() == 2 and h.dtype == torch.bfloat16 and h.stride(-1) == 1 and h.shape[0] > 0
            and w.dim() == 1 and w.dtype == torch.bfloat16 and w.shape[0] == h.shape[1] and w.stride(0) == 1)


def rope_supported(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> bool:
    """x [T, n, D] bf16 (unit last stride, D a power of two), cos/sin [T, 1, D] bf16 likewise."""
    if not (_on_device(x) and x.dim() == 3 and x.dtype == torch.bfloat16 and x.shape[0] > 0):
        return False
    T, _, D = x.shape
    return (D >= 2 and D & (D - 1) == 0 and x.stride(-1) == 1
            and all(t.dtype == torch.bfloat16 and t.shape == (T, 1, D) and t.stride(-1) == 1 for t in (cos, sin)))


@triton.jit
def _silu_mul_kernel(gu_ptr, out_ptr, inter, s_gu, s_out, BLOCK: tl.constexpr, LIBDEVICE: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < inter
    g = tl.load(gu_ptr + t * s_gu + cols, mask=ok, other=0.0).to(tl.float32)
    u = tl.load(gu_ptr + t * s_gu + inter + cols, mask=ok, other=0.0).to(tl.float32)
    if LIBDEVICE:
        e = tl.extra.cuda.libdevice.exp(-g)
    else:
        e = tl.exp(-g)
    act = _rnd(tl.math.div_rn(g, 1.0 + e), tl.bfloat16)  # F.silu's result in bf16
    tl.store(out_ptr + t * s_out + cols, _rnd(act * u, tl.bfloat16).to(tl.bfloat16), mask=ok)


def silu_mul(gu: torch.Tensor) -> torch.Tensor:
    """gu [T, 2I] = [gate | up] -> F.silu(gate) * up [T, I], bitwise torch's bf16 result."""
    if not silu_mul_supported(gu):
        raise ValueError(f"silu_mul: a [T, 2I] bf16 CUDA tensor with unit column stride, got {gu.dtype} "
                         f"{tuple(gu.shape)} on {gu.device}")
    T, two_i = gu.shape
    inter = two_i // 2
    out = torch.empty((T, inter), dtype=gu.dtype, device=gu.device)
    libdevice = os.environ.get("TRITON_INTERPRET") != "1"  # the interpreter has no libdevice
    _silu_mul_kernel[(T, triton.cdiv(inter, ROW_BLOCK))](gu, out, inter, gu.stride(0), out.stride(0),
                                                         BLOCK=ROW_BLOCK, LIBDEVICE=libdevice, num_warps=4)
    return out


@triton.jit
def _mul_rows_kernel(h_ptr, w_ptr, out_ptr, D, s_h, s_out, BLOCK: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < D
    h = tl.load(h_ptr + t * s_h + cols, mask=ok, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + t * s_out + cols, _rnd(w * h, tl.bfloat16).to(tl.bfloat16), mask=ok)


def mul_rows(h: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """w * h for h [T, D] and a row of weights w [D] (RMSNorm's scale), bitwise torch's bf16 product: torch
    broadcasts w through its strided elementwise path, ~2.5x the bytes' time for an 8B prefill's rows."""
    if not mul_rows_supported(h, w):
        raise ValueError(f"mul_rows: h [T, D] and w [D], bf16 on a CUDA device with unit column stride; got "
                         f"{tuple(h.shape)} {h.dtype}, {tuple(w.shape)} {w.dtype} on {h.device}")
    T, D = h.shape
    out = torch.empty((T, D), dtype=h.dtype, device=h.device)
    _mul_rows_kernel[(T, triton.cdiv(D, ROW_BLOCK))](h, w, out, D, h.stride(0), out.stride(0), BLOCK=ROW_BLOCK,
                                                      num_warps=4)
    return out


@triton.jit
def _rope_kernel(x_ptr, cos_ptr, sin_ptr, out_ptr, n, s_xt, s_xn, s_ct, s_st,
                 HALF: tl.constexpr, BLOCK_H: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    d = tl.arange(0, HALF)
    ok = (heads < n)[:, None]
    src = x_ptr + t * s_xt + heads[:, None].to(tl.int64) * s_xn + d[None, :]
    a = tl.load(src, mask=ok, other=0.0).to(tl.float32)  # x[..., :D/2]
    b = tl.load(src + HALF, mask=ok, other=0.0).to(tl.float32)  # x[..., D/2:] = roll(x, D/2)[..., :D/2]
    c_lo = tl.load(cos_ptr + t * s_ct + d).to(tl.float32)[None, :]
    c_hi = tl.load(cos_ptr + t * s_ct + HALF + d).to(tl.float32)[None, :]
    s_lo = tl.load(sin_ptr + t * s_st + d).to(tl.float32)[None, :]
    s_hi = tl.load(sin_ptr + t * s_st + HALF + d).to(tl.float32)[None, :]
    lo, hi = _rotate_halves(a, b, c_lo, c_hi, s_lo, s_hi, tl.bfloat16)
    dst = out_ptr + (t * n + heads[:, None].to(tl.int64)) * (2 * HALF) + d[None, :]
    tl.store(dst, lo, mask=ok)
    tl.store(dst + HALF, hi, mask=ok)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """`rope.apply_rope(x, cos, sin)` (x [T, n, D], cos/sin_signed [T, 1, D]) into a new contiguous
    [T, n, D], bitwise torch's bf16 result."""
    if not rope_supported(x, cos, sin):
        raise ValueError(f"rope: x [T, n, D] and cos/sin [T, 1, D], bf16 on a CUDA device with unit last "
                         f"stride and D a power of two; got {tuple(x.shape)} {x.dtype} on {x.device}")
    T, n, D = x.shape
    out = torch.empty((T, n, D), dtype=x.dtype, device=x.device)
    block_h = min(triton.next_power_of_2(n), max(1, 2048 // D))
    _rope_kernel[(T, triton.cdiv(n, block_h))](x, cos, sin, out, n, x.stride(0), x.stride(1),
                                               cos.stride(0), sin.stride(0), HALF=D // 2, BLOCK_H=block_h,
                                               num_warps=4)
    return out
