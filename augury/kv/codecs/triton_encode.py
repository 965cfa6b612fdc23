"""Fused encode-on-write (Triton): rows of K or V -> codes + scales in the pool, one launch.

The torch encoders take ~15-20 small ops per side per layer; on a GPU decode
step (one row per request) that launch overhead would cost more than the
attention saves. One program encodes one (row, kv head): optional randomized
Hadamard rotation (a [D, D] mat-vec), per-group affine min/max or RMS +
Lloyd-Max boundaries, bit-tight packing, scatter to the row's pool slot.
Same arithmetic as `AffineCodec.encode` / `TurboCodec.encode` (scales rounded
to fp16 first, codes against the rounded scale); ties round half up rather than
to even, so a code can differ from torch's on an exact .5 (never by more than 1).
Runs under TRITON_INTERPRET=1 on the CPU for tests.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from augury.kv.codecs.affine import AffineCodec
from augury.kv.codecs.turboquant import TurboCodec

_AFFINE, _CODEBOOK = 0, 1


def write_supported(codec) -> bool:
    """Pow2 groups dividing D are what the kernel reshapes into; others keep the torch encoder."""
    g = getattr(codec, "group_size", 0)
    # exact classes: a subclass or another codec (QJL residual, ...) may store other fields
    return type(codec) in (AffineCodec, TurboCodec) and g >= 8 and g & (g - 1) == 0


@triton.jit
def _encode_write_kernel(
    x_ptr, slots_ptr, codes_ptr, scale_ptr, zero_ptr, rot_ptr, bounds_ptr,
    s_xt, s_xh,
    HKV: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr,
    BITS: tl.constexpr, GROUP: tl.constexpr, KIND: tl.constexpr, ROTATE: tl.constexpr,
    NBYTES: tl.constexpr, BLOCK_NB: tl.constexpr, NGROUPS: tl.constexpr, NBOUNDS: tl.constexpr,
    BLOCK_BOUNDS: tl.constexpr,
):
    t = tl.program_id(0)
    h = tl.program_id(1)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < D
    x = tl.load(x_ptr + t * s_xt + h * s_xh + offs_d, mask=d_ok, other=0.0).to(tl.float32)
    if ROTATE:  # y = x @ M, M [D, D] row-major float32
        rows = tl.arange(0, BLOCK_D)
        m = tl.load(rot_ptr + rows[:, None] * D + offs_d[None, :], mask=d_ok[:, None] & d_ok[None, :], other=0.0)
        x = tl.sum(x[:, None] * m, axis=0)
    NG_P2: tl.constexpr = BLOCK_D // GROUP
    xg = tl.reshape(x, (NG_P2, GROUP))
    g_ok = tl.reshape(d_ok, (NG_P2, GROUP))
    levels: tl.constexpr = (1 << BITS) - 1
    if KIND == 0:
        lo = tl.min(tl.where(g_ok, xg, float("inf")), axis=1)
        hi = tl.max(tl.where(g_ok, xg, float("-inf")), axis=1)
        scale = tl.maximum((hi - lo) / levels, 6.2e-5).to(tl.float16).to(tl.float32)
        zero = lo.to(tl.float16).to(tl.float32)
        q = tl.floor((xg - zero[:, None]) / scale[:, None] + 0.5)
        q = tl.minimum(tl.maximum(q, 0.0), levels * 1.0)
        code = tl.reshape(q.to(tl.int32), (BLOCK_D,))
    else:
        ms = tl.sum(tl.where(g_ok, xg * xg, 0.0), axis=1) / GROUP
        scale = tl.maximum(tl.sqrt(ms), 6.2e-5).to(tl.float16).to(tl.float32)
        z = tl.reshape(xg / scale[:, None], (BLOCK_D,))
        nb = tl.arange(0, BLOCK_BOUNDS)
        bounds = tl.load(bounds_ptr + nb, mask=nb < NBOUNDS, other=float("inf"))
        # bucketize (right=False): the number of boundaries strictly below z
        code = tl.sum((bounds[None, :] < z[:, None]).to(tl.int32), axis=1)
    slot = tl.load(slots_ptr + t).to(tl.int64)
    g = tl.arange(0, NG_P2)
    g_idx = slot * (HKV * NGROUPS) + h * NGROUPS + g
    tl.store(scale_ptr + g_idx, scale.to(tl.float16), mask=g < NGROUPS)
    if KIND == 0:
        tl.store(zero_ptr + g_idx, zero.to(tl.float16), mask=g < NGROUPS)
    row = codes_ptr + slot * (HKV * NBYTES) + h * NBYTES
    if BITS == 8:
        tl.store(row + offs_d, code.to(tl.uint8), mask=d_ok)
    else:
        # byte j holds bits [8j, 8j+8) of the little-endian bitstream; code d starts at bit d*BITS
        j = tl.arange(0, BLOCK_NB)
        s = offs_d[None, :] * BITS - 8 * j[:, None]  # [NB, D] where code d sits relative to byte j
        left = code[None, :] << tl.minimum(tl.maximum(s, 0), 31)
        right = code[None, :] >> tl.minimum(tl.maximum(-s, 0), 31)
        part = tl.where(s >= 0, left, right) & 0xFF
        hit = (s > -BITS) & (s < 8) & d_ok[None, :]
        byte = tl.sum(tl.where(hit, part, 0), axis=1)
        tl.store(row + j, byte.to(tl.uint8), mask=j < NBYTES)


def encode_write(store, slots: torch.Tensor, x: torch.Tensor) -> None:
    """slots [T] long, x [T, Hkv, D] -> encoded into `store` (an EncodedStore) at those slots."""
    T, Hkv, D = x.shape
    if T == 0:
        return
    c = store.codec
    if x.stride(-1) != 1:
        x = x.contiguous()
    BLOCK_D = max(16, triton.next_power_of_2(D), c.group_size)
    kind = _AFFINE if isinstance(c, AffineCodec) else _CODEBOOK
    codes, scale = store.parts[0], store.parts[1]
    zero = store.parts[2] if kind == _AFFINE else scale
    rot = c.rotation._mat(torch.float32, x.device, False) if c.rotation is not None else scale
    if kind == _CODEBOOK:
        _, bounds = c._tables(x.device)
    else:
        bounds = scale
    nbounds = (1 << c.bits) - 1
    _encode_write_kernel[(T, Hkv)](
        x, slots, codes, scale, zero, rot, bounds, x.stride(0), x.stride(1),
        HKV=Hkv, D=D, BLOCK_D=BLOCK_D, BITS=c.bits, GROUP=c.group_size, KIND=kind,
        ROTATE=c.rotation is not None, NBYTES=codes.shape[-1], BLOCK_NB=max(16, triton.next_power_of_2(codes.shape[-1])),
        NGROUPS=scale.shape[-1], NBOUNDS=nbounds, BLOCK_BOUNDS=max(16, triton.next_power_of_2(nbounds)),
    )
