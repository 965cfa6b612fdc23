"""Fused decode attention over encoded KV blocks (Triton), for the CUDA path.

Reads the pool's stored codes directly: keys and values are each either affine
(codes + fp16 scale + fp16 zero per group) or codebook (codes + fp16 RMS per
group, value = centroid[code] * rms), codes packed bit-tight as a little-endian
bitstream (code d sits at bit d * bits of its row). Nothing is dequantized into
memory: each key/value tile is decoded in registers and consumed at once.

One program owns (request, kv head, split of the context): its query rows are
the request's max_q new tokens × the heads sharing that kv head (GQA), so every
tile is decoded once for all of them. Splits (flash-decoding) keep the GPU busy
at batch 1 with long contexts; a second small kernel merges them. Query rows are meant
to be few (decode = 1, verify = the draft width + 1), not a prefill chunk.

Rotations stay outside: the caller rotates queries for rotated keys and
un-rotates the output for rotated values, exactly as the eager path does.
Written so it also runs under TRITON_INTERPRET=1 on the CPU (tests).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from augury.layers.triton_splitkv import merge_splits_kernel, num_splits_for, partials, split_plan

from augury.kv.codecs.affine import AffineCodec
from augury.kv.codecs.base import SideCodec
from augury.kv.codecs.turboquant import TurboCodec

MAX_QUERY_ROWS = 64  # max_q * (H / Hkv) per program; wider steps (prefill) take the eager path
_AFFINE, _CODEBOOK = 0, 1


def side_supported(side: SideCodec) -> bool:
    """Exact classes only: a subclass (or any other codec, e.g. a QJL residual) may store
    other fields than (codes, scale[, zero]) and must keep the eager path."""
    return type(side) in (AffineCodec, TurboCodec) and 1 <= side.bits <= 8


def fused_supported(k_store, v_store, max_q: int, num_heads: int) -> bool:
    """True when this kernel can read these stores for a step with `max_q` rows per request."""
    rep = num_heads // k_store.num_kv_heads
    return (side_supported(k_store.codec) and side_supported(v_store.codec)
            and max_q * rep <= MAX_QUERY_ROWS)


def _side_args(store) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int, int, int]:
    """(codes, scale, aux, kind, bits, group): aux = zeros (affine) or the codebook (turbo)."""
    c = store.codec
    if isinstance(c, AffineCodec):
        codes, scale, zero = store.parts
        return codes, scale, zero, _AFFINE, c.bits, c.group_size
    codes, scale = store.parts
    cents, _ = c._tables(codes.device)
    return codes, scale, cents, _CODEBOOK, c.bits, c.group_size


@triton.jit
def _decode_tile(codes_ptr, scale_ptr, aux_ptr, slots, h, offs_d, valid, n_ok,
                 NBYTES: tl.constexpr, NGROUPS: tl.constexpr, HKV: tl.constexpr,
                 BITS: tl.constexpr, GROUP: tl.constexpr, KIND: tl.constexpr, BCAST: tl.constexpr):
    """slots [N] (int64), offs_d [BD] -> decoded float32 tile [N, BD] of kv head h.

    BCAST (needs BD == NGROUPS * GROUP, NGROUPS a power of two): load each row's group
    scales (and zeros) once as [N, NGROUPS] and broadcast them over the group, instead
    of one gathered load per element."""
    N: tl.constexpr = slots.shape[0]
    row = slots[:, None] * (HKV * NBYTES) + h * NBYTES  # [N, 1] byte offset of each row
    if BITS == 8:  # one byte per code: a contiguous (vectorized) row load
        code = tl.load(codes_ptr + row + offs_d[None, :], mask=valid, other=0).to(tl.int32)
    else:
        # 8 codes fill exactly BITS bytes: assemble each run of 8 codes into one little-endian
        # word from BITS byte loads, then split it with shifts. Loads per code: BITS / 8
        # (the per-code byte gathers this replaces cost 1-2 loads and 64-bit address math each).
        G8: tl.constexpr = offs_d.shape[0] // 8
        offs_g = tl.arange(0, G8)
        if BITS <= 4:
            word = tl.zeros([N, G8], dtype=tl.int32)
        else:
            word = tl.zeros([N, G8], dtype=tl.int64)
        for bi in tl.static_range(BITS):
            idx = offs_g * BITS + bi
            byte = tl.load(codes_ptr + row + idx[None, :], mask=n_ok[:, None] & (idx < NBYTES)[None, :], other=0)
            word = word | (byte.to(word.dtype) << (8 * bi))
        code = (word[:, :, None] >> (BITS * tl.arange(0, 8))[None, None, :]) & ((1 << BITS) - 1)
        code = tl.reshape(code, [N, G8 * 8]).to(tl.int32)
    if BCAST:
        gs = slots[:, None] * (HKV * NGROUPS) + h * NGROUPS + tl.arange(0, NGROUPS)[None, :]
        sc = tl.load(scale_ptr + gs, mask=n_ok[:, None], other=0.0).to(tl.float32)
        sc = tl.reshape(tl.broadcast_to(sc[:, :, None], [N, NGROUPS, GROUP]), [N, NGROUPS * GROUP])
    else:
        grp = slots[:, None] * (HKV * NGROUPS) + h * NGROUPS + (offs_d // GROUP)[None, :]
        sc = tl.load(scale_ptr + grp, mask=valid, other=0.0).to(tl.float32)
    if KIND == 0:
        if BCAST:
            zero = tl.load(aux_ptr + gs, mask=n_ok[:, None], other=0.0).to(tl.float32)
            zero = tl.reshape(tl.broadcast_to(zero[:, :, None], [N, NGROUPS, GROUP]), [N, NGROUPS * GROUP])
        else:
            zero = tl.load(aux_ptr + grp, mask=valid, other=0.0).to(tl.float32)
        x = code.to(tl.float32) * sc + zero
    else:
        x = tl.load(aux_ptr + code, mask=valid, other=0.0).to(tl.float32) * sc
    return x


@triton.jit
def _encoded_decode_attn_kernel(
    q_ptr, gather_ptr, bias_ptr, o_ptr,
    kc_ptr, ks_ptr, ka_ptr, vc_ptr, vs_ptr, va_ptr,
    acc_ptr, m_ptr, l_ptr,
    max_q, max_kv, split_len, num_splits, sm_scale, softcap,
    s_qb, s_qj, s_qh, s_gb, s_bb, s_bj, s_ob, s_oj, s_oh,
    HKV: tl.constexpr, REP: tl.constexpr, D: tl.constexpr,
    K_NBYTES: tl.constexpr, K_NGROUPS: tl.constexpr, K_BITS: tl.constexpr, K_GROUP: tl.constexpr,
    K_KIND: tl.constexpr, K_BCAST: tl.constexpr,
    V_NBYTES: tl.constexpr, V_NGROUPS: tl.constexpr, V_BITS: tl.constexpr, V_GROUP: tl.constexpr,
    V_KIND: tl.constexpr, V_BCAST: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    USE_SOFTCAP: tl.constexpr, FP32: tl.constexpr, SPLIT: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    sp = tl.program_id(2)
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < D
    row_ok = offs_m < max_q * REP
    j = tl.minimum(offs_m // REP, max_q - 1)  # query row (token) of each program row
    head = h * REP + offs_m % REP
    q_off = b * s_qb + j[:, None] * s_qj + head[:, None] * s_qh + offs_d[None, :]
    q = tl.load(q_ptr + q_off, mask=row_ok[:, None] & d_ok[None, :], other=0.0)  # [M, BD]
    cdt = q.dtype

    m_i = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)  # finite: fully masked tiles stay NaN-free
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    lo = sp * split_len
    hi = tl.minimum(lo + split_len, max_kv)
    for start in range(lo, hi, BLOCK_N):
        n = start + offs_n
        n_ok = n < hi
        slots = tl.load(gather_ptr + b * s_gb + n, mask=n_ok, other=0).to(tl.int64)
        valid = n_ok[:, None] & d_ok[None, :]
        k = _decode_tile(kc_ptr, ks_ptr, ka_ptr, slots, h, offs_d, valid, n_ok,
                         K_NBYTES, K_NGROUPS, HKV, K_BITS, K_GROUP, K_KIND, K_BCAST).to(cdt)  # [N, BD]
        if FP32:
            s = tl.dot(q, tl.trans(k), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(k))
        s = s * sm_scale  # [M, N] float32
        if USE_SOFTCAP:  # tanh via exp: s = c * tanh(s / c)
            t = tl.exp(-2.0 * tl.abs(s / softcap))
            s = tl.where(s >= 0, 1.0, -1.0) * softcap * (1.0 - t) / (1.0 + t)
        bias = tl.load(bias_ptr + b * s_bb + j[:, None] * s_bj + n[None, :],
                       mask=n_ok[None, :], other=float("-inf")).to(tl.float32)
        s = s + bias
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        p = tl.exp(s - m_new[:, None])
        alpha = tl.exp(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = _decode_tile(vc_ptr, vs_ptr, va_ptr, slots, h, offs_d, valid, n_ok,
                         V_NBYTES, V_NGROUPS, HKV, V_BITS, V_GROUP, V_KIND, V_BCAST).to(cdt)
        if FP32:
            acc = acc * alpha[:, None] + tl.dot(p.to(cdt), v, input_precision="ieee")
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(cdt), v)
        m_i = m_new
    if SPLIT:
        part = (b * HKV + h) * num_splits + sp  # partial results: [B, Hkv, S, M(, BD)]
        tl.store(m_ptr + part * BLOCK_M + offs_m, m_i)
        tl.store(l_ptr + part * BLOCK_M + offs_m, l_i)
        tl.store(acc_ptr + (part * BLOCK_M + offs_m[:, None]) * BLOCK_D + offs_d[None, :], acc)
    else:  # one split: normalize and write the output here, no merge launch
        o = acc / tl.maximum(l_i, 1.0e-30)[:, None]
        dst = o_ptr + b * s_ob + j[:, None] * s_oj + head[:, None] * s_oh + offs_d[None, :]
        tl.store(dst, o.to(o_ptr.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])


# Launch parameters, from the H200 sweeps (docs/data/kernels-h200.json, llama3-8b shapes, 8k):
# decoding a tile costs registers and ALU more than bytes, so short tiles, no software
# pipelining and many programs in flight (more splits) beat long serial loops over the
# context. The old choice (2 waves, >= 4 tiles of 64 keys per split, 3 stages) left B=8 at
# 8k with 5 splits of 26 tiles each.
SPLIT_MIN_TILES = 2
SPLIT_WAVES = 8.0  # batch x kv heads > 16
BLOCK_N = 32
NUM_WARPS = 4
NUM_STAGES = 1


@dataclass(frozen=True)
class LaunchConfig:
    block_n: int
    num_warps: int
    num_stages: int
    waves: float


# (key kind, key bits, value kind, value bits) -> the best measured config with a full grid
# (B = 8 at 8k); the timings move by up to 1.5x between neighbouring tile sizes (the compiler's
# layouts for the bit unpacking differ), so each measured scheme keeps its own.
_MEASURED = {
    (_AFFINE, 8, _CODEBOOK, 3): LaunchConfig(32, 4, 1, 8.0),  # turbo (k8v3): 256 us
    (_AFFINE, 4, _CODEBOOK, 3): LaunchConfig(16, 2, 1, 8.0),  # turbo:rk4v3: 367 us (459 at 32/4)
    (_AFFINE, 4, _AFFINE, 4): LaunchConfig(64, 4, 1, 8.0),  # affine4: 559 us (855 at 32/4)
}


def launch_config(batch_kv_heads: int, k_kind: int, k_bits: int, v_kind: int, v_bits: int) -> LaunchConfig:
    """From shapes and the codec only: the same step always compiles and launches the same grid."""
    if batch_kv_heads <= 16:  # B = 1-2: few programs; long tiles, fewer partials (all schemes measured at B = 1)
        return LaunchConfig(64, 4, 1, 2.0)
    return _MEASURED.get((k_kind, k_bits, v_kind, v_bits), LaunchConfig(BLOCK_N, NUM_WARPS, NUM_STAGES, SPLIT_WAVES))


GROUP_BCAST = True  # see _decode_tile; measured faster on the H200 for every scheme swept


def _num_splits(batch_kv_heads: int, max_kv: int, block_n: int, device: torch.device,
                waves: float = SPLIT_WAVES, min_tiles: int = SPLIT_MIN_TILES) -> int:
    """`num_splits_for` with this kernel's defaults."""
    return num_splits_for(batch_kv_heads, max_kv, block_n, device, waves, min_tiles)


def encoded_decode_attention(
    q: torch.Tensor,  # [B, max_q, H, D] (rotated already when keys are rotated)
    k_store,
    v_store,
    gather_slots: torch.Tensor,  # [B, max_kv] long
    bias: torch.Tensor,  # [B, 1, max_q, max_kv] additive (0 / -inf), any float dtype
    scale: float,
    softcap: float | None = None,
    num_splits: int | None = None,
    block_n: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    waves: float | None = None,
    group_bcast: bool | None = None,
) -> torch.Tensor:
    """-> [B, max_q, H, D] in q's dtype (in the value codec's basis: un-rotate outside)."""
    B, max_q, H, D = q.shape
    Hkv = k_store.num_kv_heads
    rep = H // Hkv
    max_kv = gather_slots.shape[1]
    if q.stride(-1) != 1:
        q = q.contiguous()
    gather_slots = gather_slots.contiguous()
    if bias.stride(-1) != 1:
        bias = bias.contiguous()
    BLOCK_M = max(16, triton.next_power_of_2(max_q * rep))
    BLOCK_D = max(16, triton.next_power_of_2(D))
    kc, ks, ka, kkind, kbits, kgroup = _side_args(k_store)
    vc, vs, va, vkind, vbits, vgroup = _side_args(v_store)
    cfg = launch_config(B * Hkv, kkind, kbits, vkind, vbits)
    block_n = block_n or cfg.block_n
    num_warps = num_warps or cfg.num_warps
    num_stages = num_stages or cfg.num_stages
    waves = cfg.waves if waves is None else waves
    S = num_splits or _num_splits(B * Hkv, max_kv, block_n, q.device, waves)
    S, split_len = split_plan(max_kv, S, block_n)
    out = torch.empty((B, max_q, H, D), dtype=q.dtype, device=q.device)
    acc, m, l = partials(out, Hkv, S, BLOCK_M, BLOCK_D)
    use_bcast = GROUP_BCAST if group_bcast is None else group_bcast

    def bcast(ngroups: int, group: int) -> bool:
        return use_bcast and ngroups * group == BLOCK_D and (ngroups & (ngroups - 1)) == 0

    _encoded_decode_attn_kernel[(B, Hkv, S)](
        q, gather_slots, bias, out, kc, ks, ka, vc, vs, va, acc, m, l,
        max_q, max_kv, split_len, S, float(scale), float(softcap or 1.0),
        q.stride(0), q.stride(1), q.stride(2), gather_slots.stride(0), bias.stride(0), bias.stride(2),
        out.stride(0), out.stride(1), out.stride(2),
        HKV=Hkv, REP=rep, D=D,
        K_NBYTES=kc.shape[-1], K_NGROUPS=ks.shape[-1], K_BITS=kbits, K_GROUP=kgroup, K_KIND=kkind,
        K_BCAST=bcast(ks.shape[-1], kgroup),
        V_NBYTES=vc.shape[-1], V_NGROUPS=vs.shape[-1], V_BITS=vbits, V_GROUP=vgroup, V_KIND=vkind,
        V_BCAST=bcast(vs.shape[-1], vgroup),
        BLOCK_M=BLOCK_M, BLOCK_N=block_n, BLOCK_D=BLOCK_D,
        USE_SOFTCAP=softcap is not None, FP32=q.dtype == torch.float32, SPLIT=S > 1,
        num_warps=num_warps, num_stages=num_stages,
    )
    if S > 1:
        merge_splits_kernel[(B, Hkv)](acc, m, l, out, S, max_q, out.stride(0), out.stride(1), out.stride(2),
                                       HKV=Hkv, REP=rep, D=D, BLOCK_M=BLOCK_M, BLOCK_D=BLOCK_D)
    return out
