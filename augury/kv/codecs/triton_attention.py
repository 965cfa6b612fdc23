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

Two ways to decode a tile. The "runs" path (default where the codec allows it) loads
every field as an [R, N] tensor (R runs of 8 or 16 codes per row, N keys), so all loads
share one register layout and need no shuffles; the codes of a run are joined in registers
and the finished bf16 tile goes to the tensor cores through one shared-memory store, as the
native kernel's tiles do. Codebook values of <= 4 bits are looked up two at a time in a
table of centroid pairs (one 8-byte load per two values). The older per-element path stays
for shapes the runs path does not take (head_dim not a power of two, 5/8-bit codebooks).
On CUDA an opaque register move fences the decoded tile: without it Triton hoists the
dot-operand layout conversion above the decode, onto every small load (sm_90 SASS: about
twice the barriers per tile; H200, B=8 at 8k: turbo 142 -> 126 us, affine4 141 -> 103 us).

Rotations stay outside: the caller rotates queries for rotated keys and
un-rotates the output for rotated values, exactly as the eager path does.
Written so it also runs under TRITON_INTERPRET=1 on the CPU (tests).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from augury.layers.triton_splitkv import merge_splits_kernel, num_splits_for, partials, split_plan

from augury.kv.codecs.affine import AffineCodec
from augury.kv.codecs.base import SideCodec
from augury.kv.codecs.turboquant import TurboCodec, codebook

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


def runs_supported(kind: int, bits: int, group: int, head_dim: int, codes: torch.Tensor) -> bool:
    """Whether `_load_runs` / `_finish_runs` takes this side: a power-of-two head_dim, runs (16 codes at 8 bits,
    else 8) inside one scale group, affine codes or a codebook of <= 4 bits (pair table)."""
    run = 16 if bits == 8 else 8
    if head_dim & (head_dim - 1) or head_dim % run or group % run:
        return False
    if kind == _CODEBOOK:
        return bits <= 4
    return bits < 8 or codes.data_ptr() % 4 == 0  # 8-bit rows are read as int32 words


@functools.lru_cache(maxsize=16)
def pair_table(bits: int, device: torch.device) -> torch.Tensor:
    """int64 [4**bits]: entry a | b << bits packs float32 bits of centroid a (low half) and
    centroid b (high half), so adjacent codes of a run are looked up with one load."""
    c = codebook(bits).view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    n = c.numel()
    idx = torch.arange(n * n)
    return (c[idx % n] | (c[idx // n] << 32)).to(device)


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
def _join4(c0, c1, c2, c3):
    """4 tensors [...] -> [..., 2, 2] holding c_(2i+j) at [..., i, j] (new axes in registers)."""
    return tl.join(tl.join(c0, c2), tl.join(c1, c3))


@triton.jit
def _join8(c0, c1, c2, c3, c4, c5, c6, c7):
    """8 tensors [...] -> [..., 2, 2, 2] holding c_(4i+2j+k) at [..., i, j, k]."""
    return tl.join(_join4(c0, c2, c4, c6), _join4(c1, c3, c5, c7))


@triton.jit
def _affine4(w, sc, zero, DT: tl.constexpr):
    """An int32 word of 4 affine 8-bit codes -> [..., 2, 2] in DT (code k at k)."""
    return _join4((((w & 0xFF).to(tl.float32)) * sc + zero).to(DT),
                  ((((w >> 8) & 0xFF).to(tl.float32)) * sc + zero).to(DT),
                  ((((w >> 16) & 0xFF).to(tl.float32)) * sc + zero).to(DT),
                  ((((w >> 24) & 0xFF).to(tl.float32)) * sc + zero).to(DT))


@triton.jit
def _affine_code(word, i: tl.constexpr, BITS: tl.constexpr, sc, zero, DT: tl.constexpr):
    return (((word >> (BITS * i)) & ((1 << BITS) - 1)).to(tl.int32).to(tl.float32) * sc + zero).to(DT)


@triton.jit
def _pair(pairs_ptr, word, i: tl.constexpr, BITS: tl.constexpr, sc, DT: tl.constexpr):
    """Codes 2i and 2i+1 of a run -> their values, from one 8-byte load of the pair table
    (entry a | b << BITS holds float32 bits of centroid a low, centroid b high)."""
    idx = ((word >> (2 * BITS * i)) & ((1 << (2 * BITS)) - 1)).to(tl.int32)
    pr = tl.load(pairs_ptr + idx)
    lo = (pr & 0xFFFFFFFF).to(tl.int32).to(tl.float32, bitcast=True)
    hi = (pr >> 32).to(tl.int32).to(tl.float32, bitcast=True)
    return (lo * sc).to(DT), (hi * sc).to(DT)


@triton.jit
def _load_runs(codes_ptr, scale_ptr, aux_ptr, slots, n_ok, h,
               NBYTES: tl.constexpr, NGROUPS: tl.constexpr, HKV: tl.constexpr, BITS: tl.constexpr,
               GROUP: tl.constexpr, KIND: tl.constexpr, D: tl.constexpr):
    """The stored fields of a tile as [R, N] tensors (run r of key n): (w0, w1, w2, w3, scale,
    zero). 8-bit rows come as 4 int32 words per run of 16 codes; narrower ones as one word
    (w0) per run of 8 codes. Keys past the split (n_ok false) read slot 0 with a zero scale:
    finite, and masked by the bias anyway. Codebook sides return the scale as `zero` (unused)."""
    U: tl.constexpr = 16 if BITS == 8 else 8
    R: tl.constexpr = D // U
    r2 = tl.arange(0, R)[:, None]
    s2 = slots[None, :]
    ok = n_ok[None, :]
    gs = s2 * (HKV * NGROUPS) + h * NGROUPS + (r2 * U) // GROUP  # [R, N]
    sc = tl.load(scale_ptr + gs, mask=ok, other=0.0).to(tl.float32)
    if KIND == 0:
        zero = tl.load(aux_ptr + gs, mask=ok, other=0.0).to(tl.float32)
    else:
        zero = sc
    if BITS == 8:  # rows are 4-byte aligned (runs_supported)
        wp = codes_ptr.to(tl.pointer_type(tl.int32)) + s2 * (HKV * NBYTES // 4) + h * (NBYTES // 4) + r2 * 4
        w0 = tl.load(wp)
        w1 = tl.load(wp + 1)
        w2 = tl.load(wp + 2)
        w3 = tl.load(wp + 3)
    else:
        # 8 codes fill exactly BITS bytes: one little-endian word per run from BITS byte loads
        row = codes_ptr + s2 * (HKV * NBYTES) + h * NBYTES + r2 * BITS
        if BITS <= 4:
            w0 = tl.zeros(gs.shape, dtype=tl.int32)
        else:
            w0 = tl.zeros(gs.shape, dtype=tl.int64)
        for bi in tl.static_range(BITS):
            w0 = w0 | (tl.load(row + bi).to(w0.dtype) << (8 * bi))
        w1 = w0
        w2 = w0
        w3 = w0
    return w0, w1, w2, w3, sc, zero


@triton.jit
def _finish_runs(aux_ptr, w0, w1, w2, w3, sc, zero, BITS: tl.constexpr, KIND: tl.constexpr,
                 D: tl.constexpr, DT: tl.constexpr):
    """`_load_runs`' fields -> the decoded tile [N, D] in DT: each run's codes are decoded in
    registers and joined along new minor axes, then the runs are laid side by side."""
    N: tl.constexpr = sc.shape[1]
    if BITS == 8:  # affine only (runs_supported)
        x = _join4(_affine4(w0, sc, zero, DT), _affine4(w1, sc, zero, DT), _affine4(w2, sc, zero, DT),
                   _affine4(w3, sc, zero, DT))
        x = tl.permute(x, (1, 0, 4, 5, 2, 3))  # [N, R, word (2, 2), byte (2, 2)]
    else:
        if KIND == 0:
            x = _join8(_affine_code(w0, 0, BITS, sc, zero, DT), _affine_code(w0, 1, BITS, sc, zero, DT),
                       _affine_code(w0, 2, BITS, sc, zero, DT), _affine_code(w0, 3, BITS, sc, zero, DT),
                       _affine_code(w0, 4, BITS, sc, zero, DT), _affine_code(w0, 5, BITS, sc, zero, DT),
                       _affine_code(w0, 6, BITS, sc, zero, DT), _affine_code(w0, 7, BITS, sc, zero, DT))
        else:
            c0, c1 = _pair(aux_ptr, w0, 0, BITS, sc, DT)
            c2, c3 = _pair(aux_ptr, w0, 1, BITS, sc, DT)
            c4, c5 = _pair(aux_ptr, w0, 2, BITS, sc, DT)
            c6, c7 = _pair(aux_ptr, w0, 3, BITS, sc, DT)
            x = _join8(c0, c1, c2, c3, c4, c5, c6, c7)
        x = tl.permute(x, (1, 0, 2, 3, 4))  # [N, R, code (2, 2, 2)]
    return tl.reshape(x, [N, D])


@triton.jit
def _fence(x):
    """An opaque register move (CUDA only): Triton cannot move layout conversions above it,
    so the decoded tile, not each of its loads, is what gets shuffled into the dot layout."""
    if x.dtype.primitive_bitwidth == 16:
        y = tl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [x], dtype=x.dtype, is_pure=False, pack=2)
    else:
        y = tl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [x], dtype=x.dtype, is_pure=False, pack=1)
    return y


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
    K_RUNS: tl.constexpr = False, V_RUNS: tl.constexpr = False, FENCE: tl.constexpr = False,
    EARLY_V: tl.constexpr = False, PREFETCH: tl.constexpr = False,
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
    slots_next = tl.load(gather_ptr + b * s_gb + lo + offs_n, mask=lo + offs_n < hi, other=0)
    for start in range(lo, hi, BLOCK_N):
        n = start + offs_n
        n_ok = n < hi
        if PREFETCH:  # this tile's slots were loaded one iteration ahead: one less dependent load
            slots = slots_next.to(tl.int64)
            slots_next = tl.load(gather_ptr + b * s_gb + n + BLOCK_N, mask=n + BLOCK_N < hi, other=0)
        else:
            slots = tl.load(gather_ptr + b * s_gb + n, mask=n_ok, other=0).to(tl.int64)
        valid = n_ok[:, None] & d_ok[None, :]
        if V_RUNS and EARLY_V:  # issue the value loads now; their latency hides behind q.k and softmax
            v0, v1, v2, v3, vsc, vzero = _load_runs(vc_ptr, vs_ptr, va_ptr, slots, n_ok, h, V_NBYTES, V_NGROUPS, HKV,
                                                    V_BITS, V_GROUP, V_KIND, BLOCK_D)
        if K_RUNS:
            k0, k1, k2, k3, ksc, kzero = _load_runs(kc_ptr, ks_ptr, ka_ptr, slots, n_ok, h, K_NBYTES, K_NGROUPS, HKV,
                                                    K_BITS, K_GROUP, K_KIND, BLOCK_D)
            k = _finish_runs(ka_ptr, k0, k1, k2, k3, ksc, kzero, K_BITS, K_KIND, BLOCK_D, cdt)  # [N, BD]
            if FENCE:
                k = _fence(k)
        else:
            k = _decode_tile(kc_ptr, ks_ptr, ka_ptr, slots, h, offs_d, valid, n_ok,
                             K_NBYTES, K_NGROUPS, HKV, K_BITS, K_GROUP, K_KIND, K_BCAST).to(cdt)
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
        if V_RUNS:
            if not EARLY_V:
                v0, v1, v2, v3, vsc, vzero = _load_runs(vc_ptr, vs_ptr, va_ptr, slots, n_ok, h, V_NBYTES, V_NGROUPS,
                                                        HKV, V_BITS, V_GROUP, V_KIND, BLOCK_D)
            v = _finish_runs(va_ptr, v0, v1, v2, v3, vsc, vzero, V_BITS, V_KIND, BLOCK_D, cdt)
            if FENCE:
                v = _fence(v)
        else:
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
    early_v: bool = False  # runs path: load a tile's values before its q.k (hides their latency)
    prefetch: bool = False  # runs path: load the next tile's slots one iteration ahead


# (key kind, key bits, value kind, value bits) -> the best measured config with a full grid
# (B = 8 at 8k); the timings move by up to 1.5x between neighbouring tile sizes (the compiler's
# layouts for the bit unpacking differ), so each measured scheme keeps its own. Per-element path.
_MEASURED = {
    (_AFFINE, 8, _CODEBOOK, 3): LaunchConfig(32, 4, 1, 8.0),  # turbo (k8v3): 256 us
    (_AFFINE, 4, _CODEBOOK, 3): LaunchConfig(16, 2, 1, 8.0),  # turbo:rk4v3: 367 us (459 at 32/4)
    (_AFFINE, 4, _AFFINE, 4): LaunchConfig(64, 4, 1, 8.0),  # affine4: 559 us (855 at 32/4)
}

# The runs path, by value kind, from its H200 sweep (docs/data/kv-gpu-h200-s3.json, llama3-8b
# shapes, 8k, bf16; python -m augury.bench.kv_sweep_gpu): 128-key tiles everywhere (64 measured
# 1.5-2x slower, 32 and 256 10-30% slower); 8 warps for codebook values, 4 for affine ones.
# turbo: B=1 30.2 us (native kernel 26.0), B=8 126 us (87.1); affine4: 29.7 and 103 us.
_RUNS = {
    (True, _CODEBOOK): LaunchConfig(128, 8, 1, 1.0, early_v=True, prefetch=True),
    (True, _AFFINE): LaunchConfig(128, 4, 1, 2.0, early_v=True, prefetch=True),
    (False, _CODEBOOK): LaunchConfig(128, 8, 1, 4.0, early_v=True),
    (False, _AFFINE): LaunchConfig(128, 4, 1, 4.0, early_v=True, prefetch=True),
}
RUNS = True  # decode tiles through `_load_runs` / `_finish_runs` where the codec allows it


def launch_config(batch_kv_heads: int, k_kind: int, k_bits: int, v_kind: int, v_bits: int,
                  runs: bool = False) -> LaunchConfig:
    """From shapes and the codec only: the same step always compiles and launches the same grid."""
    if runs:  # B <= 2 (few programs) or a full grid
        return _RUNS[(batch_kv_heads <= 16, v_kind)]
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
    runs: bool | None = None,
    fence: bool | None = None,
    early_v: bool | None = None,
    prefetch: bool | None = None,
) -> torch.Tensor:
    """-> [B, max_q, H, D] in q's dtype (in the value codec's basis: un-rotate outside).

    runs: decode through `_load_runs` / `_finish_runs` on each side that takes it (default) or the older
    per-element path (False; benchmarks compare them). fence: default on CUDA only (the
    interpreter has no inline assembly; the fence changes no value)."""
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
    use_runs = RUNS if runs is None else runs
    k_runs = use_runs and D == BLOCK_D and runs_supported(kkind, kbits, kgroup, D, kc)
    v_runs = use_runs and D == BLOCK_D and runs_supported(vkind, vbits, vgroup, D, vc)
    if k_runs and kkind == _CODEBOOK:
        ka = pair_table(kbits, kc.device)
    if v_runs and vkind == _CODEBOOK:
        va = pair_table(vbits, vc.device)
    cfg = launch_config(B * Hkv, kkind, kbits, vkind, vbits, k_runs and v_runs)
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
        K_RUNS=k_runs, V_RUNS=v_runs, FENCE=q.is_cuda if fence is None else fence,
        EARLY_V=cfg.early_v if early_v is None else early_v, PREFETCH=cfg.prefetch if prefetch is None else prefetch,
        num_warps=num_warps, num_stages=num_stages,
    )
    if S > 1:
        merge_splits_kernel[(B, Hkv)](acc, m, l, out, S, max_q, out.stride(0), out.stride(1), out.stride(2),
                                       HKV=Hkv, REP=rep, D=D, BLOCK_M=BLOCK_M, BLOCK_D=BLOCK_D)
    return out
