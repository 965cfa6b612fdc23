"""One-row int4 products for decode, split over K, with the input held in registers, in Triton.

The weight is an `Int4Linear`'s packed bytes read in place (tinygemm's layout,
`augury.layers.int4_layout`); the product carries `triton_gemv`'s prologues (RMS norm, SiLU-mul)
and epilogues (residual add; rope and the K/V pool writes), so the fused decode layer
(`layers/fused_decode.py`) runs int4 projections as it runs bf16 ones.

At the bandwidth, an int4 GEMV on the H200 has ~5 instructions per weight to spend, and every
Triton form measured so far was issue-bound (Nsight Compute, docs/benchmarks.md, ninth session).
An earlier form gave each program a block of rows and walked the whole of K: every K tile
re-read x and re-applied the prologue per nibble position (~8.5 instructions per weight). Here
a program owns a K slice (BKO super-tiles of 16 T columns) and a chunk of NB rows:
- it applies the prologue to its slice of x once and keeps the eight nibble positions' inputs
  in registers (`_x_nib`);
- it streams its rows BN at a time as a 2-D tile [BN * 4 BKO, T / 2] (contiguous words: one
  vector load at T = 8; a 2-D layout every Triton version assigns alike), viewed as [BN, 4 BKO, T / 2]
  for the products, so a thread keeps one (super-tile, lane) and a row's sum is a warp shuffle;
- the products: bf16/fp16 inputs (the models' dtypes) in packed fp16x2 arithmetic, a few lines
  of inline PTX per word (`_HALF2_DOT`: two nibbles into 1024.0's mantissas in one LOP3, q - 8
  in one HSUB2 / HFMA2, four HFMA2 against the inputs as fp16 pairs; ~3.7 loop instructions per
  weight on sm_90, where the fp32 decode below takes ~5.2), with the slice's inputs scaled by a
  power of two into fp16's range (`_pow2_range`, exact, undone on the partial sums); the
  interpreter, which runs no inline assembly, computes the same products in fp16 tensors. fp32
  inputs (and `half2=False`) keep an exact fp32 decode: one logic op, one add and one FMA per
  weight (`_q8o`);
- each row tile's partial sums go to a float32 workspace [S, N]; the last program of a row chunk
  to finish (an atomic counter, acquire/release) adds the S partials in slice order (all S
  loads in flight at once: S is a compile-time constant), so the result does not depend on
  which program finished last, and applies the epilogue. It resets its counter, so the
  workspace needs no clearing between calls or CUDA-graph replays.

On the H200 the fp16x2 form is no longer issue-bound but latency-bound (one row tile in flight
per program; Nsight Compute: DRAM 46%, 0.55 issued warps per scheduler per cycle with ~3 warps
resident; docs/benchmarks.md, tenth session). `stages > 1` pipelines row tiles through shared
memory instead (Triton's cp.async pipeline); it did not measure faster.

Scales: tinygemm's bf16 (scale, zero) pairs [G, N, 2] read in place as int32 [G, N] (one load per
word), or their transposed int32 copy [N, G] (`Int4Linear.gemv_scales`, what the measured path
reads: a thread's words of one row are consecutive groups, one vector load like the weight
words). Either way a group's pair is one word, the bf16 scale in the low half and the zero in the
high. Written so it also runs under TRITON_INTERPRET=1 (tests).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from augury.layers import launch_env
from augury.layers.triton_gemv import _norm_inv, _rnd, _rope_kv_epilogue, _x_in


@dataclass(frozen=True)
class W4SplitConfig:
    block_n: int = 64  # rows per loop step
    bko: int = 2  # super-tiles (16 T columns each) per K slice
    rows_per_program: int = 256  # NB: a multiple of block_n
    num_warps: int = 4
    stages: int = 1  # 1: the next row tile prefetched in registers; > 1: Triton's pipeline (shared memory)
    half2: bool = True  # bf16/fp16 inputs: packed fp16x2 products (`_HALF2_DOT`); False: the exact fp32 decode
    late_launch: bool = False  # under PDL, the next kernel launches after this program's row tiles, not at its wait


def product_class(n: int, k: int) -> str:
    """Which Llama product a [n, k] int4 weight's shape stands for: how both int4 GEMVs pick their
    launch defaults (and `launch_env` names their overrides)."""
    return ("lm_head" if n >= 65536 else "gate_up" if n >= 16384 else "down" if k >= 8192
            else "o_proj" if n <= 4096 else "qkv")


# each Llama-3-8B product's best in the H200 sweep (`python -m augury.bench.gemv_gpu --weights int4
# --sweep`, docs/data/gpu10); qkv (and any other shape) takes W4SplitConfig's own defaults
_DEFAULTS = {
    "lm_head": W4SplitConfig(block_n=32, bko=2, rows_per_program=1024, num_warps=4),
    "gate_up": W4SplitConfig(block_n=64, bko=2, rows_per_program=1024, num_warps=8),
    "down": W4SplitConfig(block_n=32, bko=2, rows_per_program=512, num_warps=4),  # long K, few rows
    "o_proj": W4SplitConfig(block_n=128, bko=2, rows_per_program=128, num_warps=4),  # fewer rows, more programs
}
_ENV_CFG = launch_env.overrides("AUGURY_W4_CFG", W4SplitConfig)  # A/B runs: `launch_env`


def default_config(n: int, k: int, ikt: int) -> W4SplitConfig:
    """Launch parameters from the weight's shape alone (a captured step always launches the same grid):
    `_DEFAULTS` by `product_class`, with AUGURY_W4_CFG's fields for that product over them."""
    cls = product_class(n, k)
    return launch_env.apply(_DEFAULTS.get(cls, W4SplitConfig()), cls, _ENV_CFG)


@triton.jit
def _q8o(src, one, b: tl.constexpr):
    """Nibble b (bits 4b..4b+3, b < 4) of each int32 word as float32 (q - 8) * 2^(4b - 23), exactly:
    or-ing the nibble, in place, into the mantissa of 1.0 gives 1 + q * 2^(4b - 23), and
    subtracting 1 + 8 * 2^(4b - 23) (same exponent: exact) leaves the rest. No shift and no
    int-to-float conversion. `one` is 1.0's bits (0x3F800000) passed at run time: the compiler
    keeps it in a register and the mask-and-or is one LOP3 with the mask as its immediate (two
    constants take two instructions)."""
    if b == 0:
        return ((src & 0xF) | one).to(tl.float32, bitcast=True) - 1.00000095367431640625
    elif b == 1:
        return ((src & 0xF0) | one).to(tl.float32, bitcast=True) - 1.0000152587890625
    elif b == 2:
        return ((src & 0xF00) | one).to(tl.float32, bitcast=True) - 1.000244140625
    else:
        return ((src & 0xF000) | one).to(tl.float32, bitcast=True) - 1.00390625


@triton.jit
def _x_up(xv, b: tl.constexpr):
    """xv * 2^(23 - 4b), exact: undoes `_q8o`'s scale, so each product is (q - 8) * x."""
    if b == 0:
        return xv * 8388608.0
    elif b == 1:
        return xv * 524288.0
    elif b == 2:
        return xv * 32768.0
    else:
        return xv * 2048.0


@triton.jit
def _x_nib(x_ptr, g_ptr, col, ok, K, inv, b: tl.constexpr, PRO: tl.constexpr, dt: tl.constexpr):
    """The prologue's input at nibble b's columns (col: nibble 0's)."""
    return _x_in(x_ptr, g_ptr, col + (b >> 2) + 8 * (b & 3), ok, K, inv, PRO, dt)


# One int32 word of 8 nibbles times its 8 inputs, in packed fp16 arithmetic (sm_53+ PTX), returned
# as fp32: sum_b (q_b - 8) * x_b. Or-ing a nibble pair (bits 0-3 and 16-19, or 4-7 and 20-23) into
# the mantissas of 1024.0 (0x6400) makes two fp16 values 1024 + q (or 1024 + 16 q) in one LOP3;
# one HSUB2 / HFMA2 leaves q - 8 in each half, exactly; four HFMA2 multiply by the inputs, packed
# as fp16 pairs ($2..$5: nibbles 0/4, 1/5, 2/6, 3/7) and accumulate the two halves, which are
# added in fp32. ~16 instructions per 8 weights, against ~24 for the fp32 decode. `.rn` keeps
# ptxas from contracting the first product into a later add.
_HALF2_DOT = tl.constexpr("""{
.reg .b32 a, b, c, d, s, acc, k1, k2, k3;
.reg .b16 lo, hi;
.reg .f32 flo, fhi;
mov.b32 k1, 0x64086408;
mov.b32 k2, 0x2C002C00;
mov.b32 k3, 0xD480D480;
lop3.b32 a, $1, 0x000F000F, 0x64006400, 0xEA;
lop3.b32 b, $1, 0x00F000F0, 0x64006400, 0xEA;
shr.u32 s, $1, 8;
lop3.b32 c, s, 0x000F000F, 0x64006400, 0xEA;
lop3.b32 d, s, 0x00F000F0, 0x64006400, 0xEA;
sub.rn.f16x2 a, a, k1;
fma.rn.f16x2 b, b, k2, k3;
sub.rn.f16x2 c, c, k1;
fma.rn.f16x2 d, d, k2, k3;
mul.rn.f16x2 acc, a, $2;
fma.rn.f16x2 acc, b, $3, acc;
fma.rn.f16x2 acc, c, $4, acc;
fma.rn.f16x2 acc, d, $5, acc;
mov.b32 {lo, hi}, acc;
cvt.f32.f16 flo, lo;
cvt.f32.f16 fhi, hi;
add.f32 $0, flo, fhi;
}""")


@triton.jit
def _h2(lo, hi):
    """Two fp32 tensors as fp16 pairs in int32 (lo in bits 0-15): `_HALF2_DOT`'s input operands."""
    lo16 = lo.to(tl.float16).to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
    return lo16 | (hi.to(tl.float16).to(tl.int16, bitcast=True).to(tl.int32) << 16)


@triton.jit
def _q16(p, b: tl.constexpr):
    """Nibble b of each word as fp16 q - 8 (the interpreter's stand-in for `_HALF2_DOT`'s decode)."""
    return (((p >> (4 * b)) & 0xF) - 8).to(tl.float16)


@triton.jit
def _half2_dot(p, x04, x15, x26, x37, x0, x1, x2, x3, x4, x5, x6, x7, ASM: tl.constexpr):
    """sum_b (q_b - 8) x_b per word of p, in fp16 arithmetic, as fp32. On the GPU the packed PTX
    (`_HALF2_DOT`, inputs as fp16 pairs x04..x37); under the interpreter (no inline assembly) the
    same products and the same per-half order in fp16 tensors (inputs x0..x7 rounded to fp16;
    mul then add, not fused)."""
    if ASM:
        return tl.inline_asm_elementwise(_HALF2_DOT, "=f,r,r,r,r,r", [p, x04, x15, x26, x37],
                                         dtype=tl.float32, is_pure=True, pack=1)
    else:
        lo = _q16(p, 0) * x0.to(tl.float16) + _q16(p, 1) * x1.to(tl.float16) + _q16(p, 2) * x2.to(tl.float16) \
            + _q16(p, 3) * x3.to(tl.float16)
        hi = _q16(p, 4) * x4.to(tl.float16) + _q16(p, 5) * x5.to(tl.float16) + _q16(p, 6) * x6.to(tl.float16) \
            + _q16(p, 7) * x7.to(tl.float16)
        return lo.to(tl.float32) + hi.to(tl.float32)


@triton.jit
def _tile_part(p, sz, one, x0, x1, x2, x3, x4, x5, x6, x7, x04, x15, x26, x37, xs, unscale, BN: tl.constexpr, RK: tl.constexpr, HW: tl.constexpr, F16: tl.constexpr):
    """One row tile's partial sums over the slice: p, sz [BN * RK, HW] words and (scale, zero) pairs."""
    p3 = tl.reshape(p, [BN, RK, HW])
    if F16:
        # (x04..x37 broadcast over the rows inside the asm; the interpreter never touches them)
        t = _half2_dot(p3, x04, x15, x26, x37, x0[None], x1[None], x2[None], x3[None],
                       x4[None], x5[None], x6[None], x7[None], F16 == 1)
    else:
        hi = p3 >> 16
        t = _q8o(p3, one, 0) * x0[None] + _q8o(p3, one, 1) * x1[None] + _q8o(p3, one, 2) * x2[None] \
            + _q8o(p3, one, 3) * x3[None] + _q8o(hi, one, 0) * x4[None] + _q8o(hi, one, 1) * x5[None] \
            + _q8o(hi, one, 2) * x6[None] + _q8o(hi, one, 3) * x7[None]
    sz3 = tl.reshape(sz, [BN, RK, HW])
    s = (sz3 << 16).to(tl.float32, bitcast=True)  # bf16 scale in the low half, zero in the high
    z = (sz3 & -65536).to(tl.float32, bitcast=True)
    return tl.sum(tl.sum(t * s + z * xs[None], axis=2), axis=1) * unscale


@triton.jit
def _slice_sum(ws_ptr, N, rows, ok, NSPLIT: tl.constexpr, PAIRED: tl.constexpr = False):
    """The K slices' partial sums of `rows`, added in slice order (the same bits whichever program
    adds them); `.cg` reads from L2, where the other programs' stores are. PAIRED: the workspace
    holds each 16-row tile's rows in the order 0, 8, 1, 9, ... (`triton_gemv_w4m`: a lane's two rows
    are one 8-byte store)."""
    if PAIRED:
        rows = rows // 16 * 16 + 2 * (rows % 8) + (rows % 16) // 8
    acc = tl.zeros(rows.shape, dtype=tl.float32)
    for s_i in tl.static_range(NSPLIT):  # unrolled: the NSPLIT loads are in flight together
        acc += tl.load(ws_ptr + s_i * N + rows, mask=ok, other=0.0, cache_modifier=".cg")
    return acc


@triton.jit
def _pow2_range(x0, x1, x2, x3, x4, x5, x6, x7):
    """(2^d, 2^-d) with max |x| 2^d in [512, 1024) over the eight tensors: em is max |x|'s exponent
    field, kept where both factors are normal floats."""
    m = tl.maximum(tl.maximum(tl.max(tl.abs(x0)), tl.max(tl.abs(x1))), tl.maximum(tl.max(tl.abs(x2)), tl.max(tl.abs(x3))))
    m = tl.maximum(m, tl.maximum(tl.maximum(tl.max(tl.abs(x4)), tl.max(tl.abs(x5))),
                                 tl.maximum(tl.max(tl.abs(x6)), tl.max(tl.abs(x7)))))
    em = tl.minimum(tl.maximum((m.to(tl.int32, bitcast=True) >> 23) & 0xFF, 10), 254)
    return ((263 - em) << 23).to(tl.float32, bitcast=True), ((em - 9) << 23).to(tl.float32, bitcast=True)


@triton.jit
def _chunk_epilogue(ws_ptr, r_ptr, y_ptr, N, pid_n, NSPLIT: tl.constexpr, row0, cos_ptr, sin_ptr, kp_ptr, vp_ptr,
                    slot_ptr, s_kslot, s_kh, s_vslot, s_vh, n_q, n_qk, RESIDUAL: tl.constexpr, ROPE_KV: tl.constexpr,
                    HALF: tl.constexpr, PP: tl.constexpr, NB: tl.constexpr, dt: tl.constexpr,
                    PAIRED: tl.constexpr = False):
    """A row chunk's output from its K slices' partial sums in the workspace: added in slice order,
    then the epilogue (residual, or rope and the K/V pool writes). PAIRED: `_slice_sum`'s."""
    if ROPE_KV:
        D: tl.constexpr = 2 * HALF
        # PP rope pairs at a time: entry 2j is row j0 + j of the head, entry 2j + 1 its partner D/2 further
        pe = tl.arange(0, 2 * PP)
        for hh in tl.static_range(NB // D):
            head = pid_n * (NB // D) + hh
            for j0 in tl.static_range(0, HALF, PP):
                rr = head * D + (pe % 2) * HALF + j0 + pe // 2
                acc = _slice_sum(ws_ptr, N, rr, rr < N, NSPLIT, PAIRED)
                _rope_kv_epilogue(_rnd(acc, dt).to(dt), head, j0, cos_ptr, sin_ptr, y_ptr, kp_ptr, vp_ptr,
                                  slot_ptr, s_kslot, s_kh, s_vslot, s_vh, n_q, n_qk, HALF=HALF, P=PP)
    else:
        EP: tl.constexpr = NB & -NB  # rows at a time: NB itself, or its largest power-of-two divisor
        for piece in tl.static_range(NB // EP):
            rr = row0 + piece * EP + tl.arange(0, EP)
            ok = rr < N
            _rows_store(_slice_sum(ws_ptr, N, rr, ok, NSPLIT, PAIRED), rr, ok, r_ptr, y_ptr, RESIDUAL, dt)


@triton.jit
def _rows_store(acc, rr, ok, r_ptr, y_ptr, RESIDUAL: tl.constexpr, dt: tl.constexpr):
    """A chunk's rows rr from their fp32 sums: rounded to the dtype, plus the residual (rounded again), stored.
    Elementwise ops, loads and stores only, so the Gluon int4 product (`gluon_gemv_w4m`) calls it too."""
    y = _rnd(acc, dt).to(dt)
    if RESIDUAL:
        y = _rnd(y.to(tl.float32) + tl.load(r_ptr + rr, mask=ok, other=0.0).to(tl.float32), dt).to(dt)
    tl.store(y_ptr + rr, y, mask=ok)


@triton.jit
def _finish(ws_ptr, cnt_ptr, r_ptr, y_ptr, N, pid_n, NSPLIT: tl.constexpr, row0, cos_ptr, sin_ptr, kp_ptr, vp_ptr, slot_ptr,
            s_kslot, s_kh, s_vslot, s_vh, n_q, n_qk, RESIDUAL: tl.constexpr, ROPE_KV: tl.constexpr,
            HALF: tl.constexpr, PP: tl.constexpr, NB: tl.constexpr, dt: tl.constexpr, PAIRED: tl.constexpr = False):
    """After a program's partial sums are in the workspace: the last of its chunk's K programs adds
    the chunk's partials in slice order and applies the epilogue (all the programs' stores are
    visible to it: each program's barrier + release, its acquire). PAIRED: `_slice_sum`'s."""
    tl.debug_barrier()
    _finish_count(ws_ptr, cnt_ptr, r_ptr, y_ptr, N, pid_n, 1, NSPLIT, NSPLIT, row0, cos_ptr, sin_ptr, kp_ptr, vp_ptr,
                  slot_ptr, s_kslot, s_kh, s_vslot, s_vh, n_q, n_qk, RESIDUAL, ROPE_KV, HALF, PP, NB, dt, PAIRED)


@triton.jit
def _finish_count(ws_ptr, cnt_ptr, r_ptr, y_ptr, N, chunk, inc, total, NSPLIT: tl.constexpr, row0, cos_ptr, sin_ptr,
                  kp_ptr, vp_ptr, slot_ptr, s_kslot, s_kh, s_vslot, s_vh, n_q, n_qk, RESIDUAL: tl.constexpr,
                  ROPE_KV: tl.constexpr, HALF: tl.constexpr, PP: tl.constexpr, NB: tl.constexpr, dt: tl.constexpr,
                  PAIRED: tl.constexpr):
    """`_finish` after its barrier, for a program that stored `inc` of the `total` partial pieces of its row
    chunk `chunk`: the one whose count completes the chunk adds and applies the epilogue."""
    prev = tl.atomic_add(cnt_ptr + chunk, inc, sem="acq_rel", scope="gpu")
    if prev + inc == total:
        _chunk_epilogue(ws_ptr, r_ptr, y_ptr, N, chunk, NSPLIT, row0, cos_ptr, sin_ptr, kp_ptr, vp_ptr, slot_ptr,
                        s_kslot, s_kh, s_vslot, s_vh, n_q, n_qk, RESIDUAL, ROPE_KV, HALF, PP, NB, dt, PAIRED)
        tl.atomic_xchg(cnt_ptr + chunk, 0)  # ready for the next call (or graph replay)


@triton.jit
def _w4_split_kernel(
    x_ptr, g_ptr, w_ptr, sz_ptr, r_ptr, y_ptr, ws_ptr, cnt_ptr,
    N, K, G, one, eps, norm_k,
    cos_ptr, sin_ptr, kp_ptr, vp_ptr, slot_ptr, s_kslot, s_kh, s_vslot, s_vh, n_q, n_qk,
    PRO: tl.constexpr, RESIDUAL: tl.constexpr, ROPE_KV: tl.constexpr, HALF: tl.constexpr, PP: tl.constexpr,
    GS: tl.constexpr, IKT: tl.constexpr, NB: tl.constexpr, BN: tl.constexpr, BKO: tl.constexpr,
    SZT: tl.constexpr, PDL: tl.constexpr, F16: tl.constexpr, STAGES: tl.constexpr, NSPLIT: tl.constexpr,
    NORM_BLOCK: tl.constexpr, LATE_LAUNCH: tl.constexpr = False,
):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    SPAN: tl.constexpr = 16 * IKT  # columns per super-tile; also words per 8-row block of one
    HW: tl.constexpr = IKT // 2
    RK: tl.constexpr = 4 * BKO  # (super-tile, lane r) pairs of the slice: a row's words there are RK x HW
    KSUP = K // SPAN
    dt = y_ptr.dtype.element_ty
    # A row tile is 2-D, [BN * RK, HW] (row-major over (row, super-tile, lane)): HW contiguous words
    # per entry, one vector load, and a 2-D layout that every Triton version assigns alike (threads
    # along the entries, 4 words each). Viewed as [BN, RK, HW] (a reshape that moves nothing, as
    # RK divides the 32 lanes of a warp) a thread keeps one (super-tile, lane) across all its rows
    # and row tiles, so its slice of x is HW words x 8 nibbles in registers, and a row's sum is a
    # shuffle reduction within a warp.
    e = tl.arange(0, BN * RK)
    kt_e = pid_k * BKO + (e // 4) % BKO
    ok_e = (kt_e < KSUP)[:, None]
    w = tl.arange(0, HW)
    word = (kt_e * SPAN + (e % 4) * HW)[:, None] + w[None, :]  # offset in the row's 8-row block
    if GS == 32:
        grp = (kt_e * (SPAN // 32))[:, None] + w[None, :]
    else:
        grp = ((kt_e * SPAN)[:, None] + 32 * w[None, :]) // GS
    row0 = pid_n * NB
    row_e = e // RK

    # the chunk's rows advance BN at a time: BN / 8 whole 8-row blocks of words, BN rows of scales
    w_ptrs = w_ptr + ((row0 + row_e) // 8).to(tl.int64)[:, None] * (KSUP * SPAN) + ((row_e % 8) * (2 * IKT))[:, None] + word
    if SZT:  # [N, G]: a row's consecutive groups are one vector load
        s_ptrs = sz_ptr + (row0 + row_e).to(tl.int64)[:, None] * G + grp
        s_step = BN * G
    else:  # tinygemm's own [G, N] pairs, read in place: one load per word (rows of a group are adjacent)
        s_ptrs = sz_ptr + grp.to(tl.int64) * N + (row0 + row_e)[:, None]
        s_step = BN
    w_step = (BN // 8) * KSUP * SPAN
    if STAGES == 1:  # the first row tile depends on no earlier kernel: in flight before gdc_wait
        p = tl.load(w_ptrs, mask=ok_e & (row0 + row_e < N)[:, None], other=0)
        sz = tl.load(s_ptrs, mask=ok_e & (row0 + row_e < N)[:, None], other=0)
    if PDL:
        tl.extra.cuda.gdc_wait()  # x, r, the workspace and the counters belong to the previous kernel until here
        if not LATE_LAUNCH:
            tl.extra.cuda.gdc_launch_dependents()
    inv = 1.0
    if PRO == 1:
        inv = _norm_inv(x_ptr, K, norm_k, eps, NORM_BLOCK)
    # the slice's inputs, once, as [RK, HW]: nibble b of a word multiplies x at column
    # col + (b >> 2) + 8 (b & 3)
    j = tl.arange(0, RK)
    kt_j = pid_k * BKO + j // 4
    ok_j = (kt_j < KSUP)[:, None]
    col = (kt_j * SPAN + 2 * (j % 4))[:, None] + 32 * w[None, :]
    x0 = _x_nib(x_ptr, g_ptr, col, ok_j, K, inv, 0, PRO, dt)
    x1 = _x_nib(x_ptr, g_ptr, col, ok_j, K, inv, 1, PRO, dt)
    x2 = _x_nib(x_ptr, g_ptr, col, ok_j, K, inv, 2, PRO, dt)
    x3 = _x_nib(x_ptr, g_ptr, col, ok_j, K, inv, 3, PRO, dt)
    x4 = _x_nib(x_ptr, g_ptr, col, ok_j, K, inv, 4, PRO, dt)
    x5 = _x_nib(x_ptr, g_ptr, col, ok_j, K, inv, 5, PRO, dt)
    x6 = _x_nib(x_ptr, g_ptr, col, ok_j, K, inv, 6, PRO, dt)
    x7 = _x_nib(x_ptr, g_ptr, col, ok_j, K, inv, 7, PRO, dt)
    xs = (x0 + x4) + (x1 + x5) + (x2 + x6) + (x3 + x7)  # sum of each word's 8 inputs (the zero term)
    # the slice's inputs times 2^d, with max |x| 2^d in [512, 1024): in fp16's range, a half's sum of
    # four (q - 8) x stays below 2^15; for the fp32 decode, `_x_up`'s 2^23 cannot overflow. Exact
    # (a power of two) and undone on the partial sums
    up, unscale = _pow2_range(x0, x1, x2, x3, x4, x5, x6, x7)
    x0, x1, x2, x3, x4, x5, x6, x7, xs = x0 * up, x1 * up, x2 * up, x3 * up, x4 * up, x5 * up, x6 * up, x7 * up, xs * up
    x04, x15, x26, x37 = 0, 0, 0, 0  # the PTX's fp16 pairs (F16 == 1 only)
    if F16 == 1:
        x04, x15, x26, x37 = _h2(x0, x4), _h2(x1, x5), _h2(x2, x6), _h2(x3, x7)
    elif F16 == 0:  # pre-scaled for `_q8o`
        x0, x1, x2, x3 = _x_up(x0, 0), _x_up(x1, 1), _x_up(x2, 2), _x_up(x3, 3)
        x4, x5, x6, x7 = _x_up(x4, 0), _x_up(x5, 1), _x_up(x6, 2), _x_up(x7, 3)
    i = tl.arange(0, BN)
    if STAGES == 1:
        for rt in range(0, NB, BN):
            # the next row tile is in flight while this one is used (none after the chunk's last)
            w_ptrs += w_step
            s_ptrs += s_step
            nxt = ok_e & ((row0 + rt + BN + row_e < N) & (rt + BN < NB))[:, None]
            p_next = tl.load(w_ptrs, mask=nxt, other=0)
            sz_next = tl.load(s_ptrs, mask=nxt, other=0)
            part = _tile_part(p, sz, one, x0, x1, x2, x3, x4, x5, x6, x7, x04, x15, x26, x37,
                              xs, unscale, BN, RK, HW, F16)
            out = row0 + rt + i
            tl.store(ws_ptr + pid_k * N + out, part, mask=out < N)
            p = p_next
            sz = sz_next
    else:  # Triton's software pipeline: STAGES - 1 row tiles in flight through shared memory
        for rt in tl.range(0, NB, BN, num_stages=STAGES):
            okr = ok_e & (row0 + rt + row_e < N)[:, None]
            p = tl.load(w_ptrs + (rt // BN) * w_step, mask=okr, other=0)
            sz = tl.load(s_ptrs + (rt // BN) * s_step, mask=okr, other=0)
            part = _tile_part(p, sz, one, x0, x1, x2, x3, x4, x5, x6, x7, x04, x15, x26, x37,
                              xs, unscale, BN, RK, HW, F16)
            out = row0 + rt + i
            tl.store(ws_ptr + pid_k * N + out, part, mask=out < N)

    if PDL and LATE_LAUNCH:
        tl.extra.cuda.gdc_launch_dependents()
    _finish(ws_ptr, cnt_ptr, r_ptr, y_ptr, N, pid_n, NSPLIT, row0, cos_ptr, sin_ptr, kp_ptr, vp_ptr, slot_ptr,
            s_kslot, s_kh, s_vslot, s_vh, n_q, n_qk, RESIDUAL, ROPE_KV, HALF, PP, NB, dt)


_WORKSPACE: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
_RETIRED: list[torch.Tensor] = []  # outgrown buffers: a captured CUDA graph may still point at them


def _workspace(device: torch.device, floats: int, counters: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The partial-sum buffer and the (self-resetting, zeroed once) counters of one device. Every
    kernel that uses them runs after the previous one has finished (stream order, and with PDL
    a kernel touches them only after waiting for the previous one; augury orders its side
    streams with `wait_stream`), so they are shared. One set per device, not per stream: the
    engine warms up on a side stream and captures its CUDA graphs on another, and the capture
    must find them allocated (and the counters zeroed) by the warm-up. Sized generously (16 MB;
    an 8B model's LM head needs 4) so later, larger calls rarely reallocate."""
    key = str(device)
    ws, cnt = _WORKSPACE.get(key, (None, None))
    if ws is None or ws.numel() < floats or cnt.numel() < counters:
        if ws is not None:
            _RETIRED.extend((ws, cnt))
        ws = torch.empty(max(floats, 1 << 22, 0 if ws is None else ws.numel()), dtype=torch.float32, device=device)
        cnt = torch.zeros(max(counters, 1 << 14, 0 if cnt is None else cnt.numel()), dtype=torch.int32, device=device)
        _WORKSPACE[key] = (ws, cnt)
    return ws, cnt


def row_chunks(n: int, cfg, rope_kv: bool, half: int, pow2: bool = True) -> tuple[int, int]:
    """(rows per loop step, rows per program) of a split-K int4 launch from its config (block_n,
    rows_per_program): for rope_kv, whole heads per chunk (the epilogue rotates pairs D/2 apart) and
    row tiles of the largest power of two dividing the head (D % 8 == 0). pow2: rows_per_program must
    be a power of two (the tensor-core GEMV takes any multiple of its warps' tiles)."""
    nb, bn = cfg.rows_per_program, cfg.block_n
    if rope_kv:
        bn = min(bn, 2 * half & -(2 * half))
        nb = 2 * half
        while 2 * nb <= cfg.rows_per_program and n % (2 * nb) == 0:
            nb *= 2
        if n % nb:
            raise ValueError(f"gemv: {n} rows are not whole heads of {2 * half}")
    elif nb % bn or (pow2 and nb & (nb - 1)):
        raise ValueError(f"gemv: rows_per_program must be {'a power of two and ' if pow2 else ''}a multiple of "
                         f"block_n, got {cfg}")
    return bn, nb


def launch(x: torch.Tensor, g: torch.Tensor, w: torch.Tensor, sz: torch.Tensor, r: torch.Tensor, y: torch.Tensor,
           n: int, k: int, eps: float, rope_args: tuple, *, pro: int, residual: bool, rope_kv: bool, half: int,
           group_size: int, ikt: int, cfg: W4SplitConfig | None, pdl: bool, transposed: bool = True) -> None:
    """`_w4_split_kernel` over (row chunks, K slices); arguments as `triton_gemv._launch` prepares them."""
    cfg = cfg or default_config(n, k, ikt)
    if cfg.stages < 1:
        raise ValueError(f"gemv: int4 stages must be >= 1, got {cfg}")
    if cfg.block_n < 8 or cfg.bko < 1 or cfg.block_n & (cfg.block_n - 1) or cfg.bko & (cfg.bko - 1):
        # row tiles advance by whole 8-row blocks of tinygemm's layout
        raise ValueError(f"gemv: int4 block_n (>= 8) and bko must be powers of two, got {cfg}")
    bn, nb = row_chunks(n, cfg, rope_kv, half)
    grid = (triton.cdiv(n, nb), triton.cdiv(k // (16 * ikt), cfg.bko))
    ws, cnt = _workspace(x.device, grid[1] * n, grid[0])
    # fp16x2 products for 16-bit activations: packed PTX on the GPU, plain fp16 tensors under the
    # interpreter (which runs no inline assembly); fp32 activations keep the exact fp32 decode
    compiled = x.device.type == "cuda" and os.environ.get("TRITON_INTERPRET") != "1"
    f16 = 0 if x.dtype == torch.float32 or not cfg.half2 else 1 if compiled else 2
    _w4_split_kernel[grid](
        x, g, w, sz, r, y, ws, cnt, n, k, k // group_size, 0x3F800000, eps, float(k), *rope_args,
        PRO=pro, RESIDUAL=residual, ROPE_KV=rope_kv, HALF=half, PP=min(64, half & -half), GS=group_size, IKT=ikt,
        NB=nb, BN=bn, BKO=cfg.bko, SZT=transposed, PDL=pdl, F16=f16, STAGES=cfg.stages, LATE_LAUNCH=cfg.late_launch,
        # the slice count is a constant, so the chunk's last program issues all its slice loads at
        # once; the norm reads x in one step (one round trip, not K / 1024)
        NSPLIT=grid[1], NORM_BLOCK=min(triton.next_power_of_2(k), 4096),
        num_warps=cfg.num_warps, num_stages=1, **({"launch_pdl": True} if pdl else {}),
    )
