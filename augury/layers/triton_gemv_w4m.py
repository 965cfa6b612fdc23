"""One-row int4 products for decode on the tensor cores (m16n8k16 mma), split over K, in Triton.

The fp16x2 GEMVs (`triton_gemv_w4`, `triton_gemv_w4r`) spend ~2.9 loop instructions per weight (offline
sm_90 SASS): decode, the fp16x2 dot, fp32 conversions and adds, and per-entry scale work. Here the dot
and its sums run inside `mma.sync.m16n8k16` (fp16 in, fp32 accumulate), so a weight costs its share of
a decode (one LOP3 per fp16x2 register, one shift per word: 5 instructions for 8 weights) and of one
mma per word, plus a 16-byte load per 4 words.

The trick that keeps the scales out of the inner loop: the mma's 8 output columns are the 8 groups
(32 columns each) of a 256-column block, not 8 copies of one. Its k index kappa = 2 n + e of the j-th
mma of a block stands for column 32 n + 2 j + e, and the B operand holds x at (kappa, n) only, zero
elsewhere. After the block's 16 mmas, C[m, n] is row m's dot over group n alone, and each lane holds
four such (row, group) entries -- exactly where one (scale, zero) applies: 4 FMAs per 128 weights. A
lane's B registers are x's fp16 pairs of one group (lanes with g == t: group t in b0; g == t + 4:
group t + 4 in b1), zero in the other 24 lanes; built once per program (the block is the program's K
slice), they serve all its row tiles.

Decode: or-ing a nibble pair into 1024.0's mantissas makes fp16 1024 + q (bits 0-3, 16-19) or
1024 + 16 q (bits 4-7, 20-23; x of those groups is fed divided by 16, exactly), so C carries the
offset 1024 sum(x) (resp. 64 sum(x)) plus the q - 8 form's 8 sum(x): the accumulators start at minus
that, computed by 16 mmas with A = 1.0 over the same fp16 inputs (`_MMA_ONES`), once per program.
x is scaled by a power of two into fp16's range first (per warp, by a butterfly max; exact, undone on
the sums).

Layout (`int4_layout.pack_mma`): int32 [K / 256, N / 16, 512], tiles of 16 rows x 256 columns in
(block, row tile) order, a program's tiles contiguous; scales (`int4_layout.scales_mma`) int32
[K / 256, N / 16, 128], lane-major, the bf16 scale in the low half and the zero in the high (value
(q - 8) * scale + zero, tinygemm's). A program = one 256-column block x a chunk of rows; warp w takes
its row tiles w, w + W, ...; the K slices' partial sums and the epilogues are `triton_gemv_w4`'s
(`_finish`). The row-per-thread [32 W, 4] tensors the asm sees are 16-byte loads: Triton gives each
thread one row of them, so element (i, .) is lane i % 32 of warp i // 32 as the mma fragments need
(checked on the H200 against the dequantized product). Under TRITON_INTERPRET=1 (no inline
assembly) `_mma4` emulates the warp-wide mma on the same registers, so CI checks the layout, the lane
roles and the offsets on the CPU.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from augury.layers import launch_env
from augury.layers.triton_pdl import prefetch_l2
from augury.layers.int4_layout import MMA_COLS, MMA_ROWS
from augury.layers.triton_gemv import _norm_inv, _rnd, _x_apply, _x_load, _x_merge
from augury.layers.triton_gemv_w4 import _finish, _h2, _workspace, product_class, row_chunks


@dataclass(frozen=True)
class W4MmaConfig:
    rows_per_program: int = 512  # NB: a multiple of 16 x num_warps (each warp takes NB / 16 / W row tiles)
    num_warps: int = 4
    late_launch: bool = False  # under PDL, the next kernel launches after this program's row tiles, not at its wait
    prefetch: int = 1  # tiles each warp keeps in flight while it uses one (1 to 4)
    stages: int = 1  # > 1: the loop's loads also pipelined that deep through shared memory (Triton's cp.async)
    k_major: bool = False  # launch order: a row chunk's K slices adjacent (else a K slice's chunks)
    block_n: int = 16  # rows per step of a warp (a tile); only row_chunks reads it (rope: whole heads)
    # > 0: a persistent grid of this many programs a multiprocessor, each streaming an equal run of the weight's
    # tiles (`triton_gemv_w4m_stream`); rows_per_program is then the split-K finish's row chunk
    persistent: int = 0
    # > 0: ptxas caps each thread at this many registers (spilling the rest): 3-4 tiles in flight take 153-168,
    # which leaves 3 programs a multiprocessor; capped at 128 they keep 4 (offline sm_90: PF 3 spills 56 bytes)
    maxnreg: int = 0
    # > 0: each loop step also asks the L2 for the warp's tile this many beyond its register prefetch (one
    # 128-byte line a lane: no registers held), so its later load meets the L2's latency rather than the DRAM's
    l2_ahead: int = 0
    # > 0: before the PDL wait, the L2 is asked for this many of each warp's tiles beyond those loaded there
    # (stages > 1, which loads none there: its first ones)
    l2_first: int = 0
    # the weight stream's cache hint: 0 none, 1 not allocated in L1 (`.cg`), 2 evict-first (+7.2% int4 B=1 end to
    # end on an H100, thirty-ninth session); the persistent grid (`persistent` > 0) takes it too
    weight_cache: int = 2
    # > 0: the product as `gluon_gemv_w4m`'s two launches, its weight stream staged this many tiles deep (2, 4 or
    # 8) through shared memory by each thread's own cp.async; CUDA with Gluon only, the Triton kernel elsewhere
    # (under the interpreter, where Gluon does not run) and for launches it does not take (`gluon_gemv_w4m.fits`).
    # Opt-in, and slower as built: on an H100 (forty-fourth session) the layer chain took 91.7-93.3 against 72.2-72.4
    # us a layer with all four products on it (each alone: qkv +2.1, o_proj +4.0, gate_up +10.5, down +14.3 us),
    # int4 B=1 327.6 / 327.7 against 413.3 / 412.9 tok/s, though its loop alone beat the Triton kernel 1.07-1.64x
    gluon: int = 0


# each Llama-3-8B product's best in the H200 probe (docs/benchmarks.md, twenty-second session;
# docs/data/gpu22/w4m_probe.py): us per call against the row-layout GEMV's defaults; then in the layer chain
# and end to end: early launch (these grids, 384-896 programs for the layer products, fill the machine:
# 68.9 / 69.9 us a layer against 71.6 / 71.7 late), qkv on two warps x 128 rows (67.8 / 67.7 against 68.2 /
# 68.7; 439.8 / 440.1 against 438.8 / 438.4 tok/s), and the layer products K-major (a chunk's K slices
# launched together, so chunks finish and add their slices all along the launch, not all at its end: 66.7 /
# 67.0 against 67.5 / 68.0 us a layer; 448.5 / 447.6 against 440.0 tok/s)
_DEFAULTS = {
    "lm_head": W4MmaConfig(rows_per_program=256, num_warps=4, prefetch=2),  # 96.2 vs 107.6
    # gate_up in 32 chunks of 896 rows: 512 programs, one wave at four a multiprocessor (512 rows: 896 programs,
    # 1.7 waves, the multiprocessors idle 19% of the kernel under ncu): 66.2 / 66.3 against 66.7 / 67.2 us a
    # layer, 450.7 / 451.0 against 446.4 / 445.2 tok/s (twenty-fifth session)
    "gate_up": W4MmaConfig(rows_per_program=896, num_warps=4, prefetch=2, k_major=True),  # 26.0 vs 26.4 (512)
    "down": W4MmaConfig(rows_per_program=512, num_warps=4, prefetch=2, k_major=True),  # 15.9 vs 17.3
    "o_proj": W4MmaConfig(rows_per_program=128, num_warps=4, prefetch=1, k_major=True),  # 6.4 vs 7.5
    "qkv": W4MmaConfig(rows_per_program=128, num_warps=2, prefetch=2, k_major=True),  # 8.1 vs 10.9 (4 x 256)
}
# every product's weight loads evict-first (the dataclass default, thirty-ninth session, H100): layer chain 72.1 /
# 71.8 against 78.6 / 77.7 us, attention adding 7.3 against 10.9 of it; 413.6 / 413.7 against 385.8 / 385.5 tok/s
_ENV_CFG = launch_env.overrides("AUGURY_W4M_CFG", W4MmaConfig)  # A/B runs: `launch_env`


def default_config(n: int, k: int) -> W4MmaConfig:
    """Launch parameters from the weight's shape alone: `_DEFAULTS` by `product_class`, then
    AUGURY_W4M_CFG's fields for that product."""
    cls = product_class(n, k)
    return launch_env.apply(_DEFAULTS[cls], cls, _ENV_CFG)


def pack(q: torch.Tensor, scales_t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """q [N, K] (0..15) and int32 (scale, zero) pairs [N, K / 32] -> this GEMV's weight and scales."""
    from augury.layers.int4_layout import pack_mma, scales_mma

    return pack_mma(q), scales_mma(scales_t)


def supported(n: int, k: int, group_size: int) -> bool:
    """Shapes this kernel's layout holds: 16-row tiles, 256-column blocks, groups of 32."""
    return group_size == 32 and n % MMA_ROWS == 0 and k % MMA_COLS == 0


def pack_from_tinygemm(packed: torch.Tensor, scales_t: torch.Tensor, chunk_rows: int = 4096
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """`pack` of a weight held in tinygemm's layout (`Int4Linear.packed` on CUDA), on its device, a few
    thousand rows at a time (an 8B LM head's nibbles at once would take GBs)."""
    from augury.layers.int4_layout import pack_mma, scales_mma, unpack

    n = 8 * packed.shape[0]
    k = 16 * (2 * packed.shape[3]) * packed.shape[1]
    w = torch.empty((k // MMA_COLS, n // MMA_ROWS, 512), dtype=torch.int32, device=packed.device)
    sz = torch.empty((k // MMA_COLS, n // MMA_ROWS, 128), dtype=torch.int32, device=packed.device)
    step = max(MMA_ROWS, chunk_rows // MMA_ROWS * MMA_ROWS)
    for r0 in range(0, n, step):
        r1 = min(n, r0 + step)
        w[:, r0 // 16: r1 // 16] = pack_mma(unpack(packed[r0 // 8: r1 // 8]))
        sz[:, r0 // 16: r1 // 16] = scales_mma(scales_t[r0:r1].contiguous())
    return w, sz


# Four m16n8k16 mmas, one per word of a 16-byte load: $4-$7 the words (A: decoded here), $8-$11 and
# $12-$15 each mma's b0 / b1 (x's fp16 pairs or 0), $16-$19 the accumulators in, $0-$3 out. The
# accumulators live in local registers between the mmas (an output may share a register with an
# input that is still to be read).
def _mma4_asm(ones: bool) -> str:
    body = [".reg .b32 a0, a1, a2, a3, s;", ".reg .f32 d0, d1, d2, d3;",
            "mov.f32 d0, $16;", "mov.f32 d1, $17;", "mov.f32 d2, $18;", "mov.f32 d3, $19;"]
    if ones:
        body += ["mov.b32 a0, 0x3C003C00;", "mov.b32 a1, a0;", "mov.b32 a2, a0;", "mov.b32 a3, a0;"]
    for j in range(4):
        if not ones:
            w = f"${4 + j}"
            body += [f"lop3.b32 a0, {w}, 0x000F000F, 0x64006400, 0xEA;",
                     f"lop3.b32 a2, {w}, 0x00F000F0, 0x64006400, 0xEA;",
                     f"shr.u32 s, {w}, 8;",
                     "lop3.b32 a1, s, 0x000F000F, 0x64006400, 0xEA;",
                     "lop3.b32 a3, s, 0x00F000F0, 0x64006400, 0xEA;"]
        body.append("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {d0, d1, d2, d3}, {a0, a1, a2, a3}, "
                    f"{{${8 + j}, ${12 + j}}}, {{d0, d1, d2, d3}};")
    body += ["mov.f32 $0, d0;", "mov.f32 $1, d1;", "mov.f32 $2, d2;", "mov.f32 $3, d3;"]
    return "{\n" + "\n".join(body) + "\n}"


_MMA4 = tl.constexpr(_mma4_asm(False))


def _butterfly_asm(pre: list[str], op: str, regs: str, masks: tuple[int, ...], outs: str) -> str:
    """PTX over a warp: `pre`, then for each lane mask each of `regs` combined (`op`) with its butterfly
    partner's, then the outputs moved from `outs` (one register name per output)."""
    body = [f".reg .f32 {', '.join(sorted(set(regs)))}, u;", *pre]
    for m in masks:
        for r in regs:
            body += [f"shfl.sync.bfly.b32 u, {r}, {m}, 0x1f, 0xffffffff;", f"{op} {r}, {r}, u;"]
    body += [f"mov.f32 ${i}, {r};" for i, r in enumerate(outs)]
    return "{\n" + "\n".join(body) + "\n}"


# the max of $1 over the warp's 32 lanes
_WARP_MAX = tl.constexpr(_butterfly_asm(["mov.f32 a, $1;"], "max.f32", "a", (16, 8, 4, 2, 1), "a"))
# a lane's two entries of row g ($4, $5) and of row g + 8 ($6, $7), then over the 4 lanes t of its g
_ROW_SUMS = tl.constexpr(_butterfly_asm(["add.f32 a, $4, $5;", "add.f32 b, $6, $7;"], "add.f32", "ab", (1, 2),
                                        "aabb"))
_MMA_ONES = tl.constexpr(_mma4_asm(True))


@triton.jit
def _half(b, hi: tl.constexpr):
    """fp16 half of int32 pairs (low half: the pair's first column) as fp32."""
    h = (b >> 16) if hi else b
    return (h & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _emu_mma(a_lt, a_lb, a_ht, a_hb, b0, b1, W: tl.constexpr):
    """The warp-wide m16n8k16 product of one register set, for the interpreter: A's four registers
    per lane as fp32 halves [W, 8 g, 4 t, 2 e] (a0: row g, kappa 2t+e; a1: row g+8; a2: row g,
    kappa 8+2t+e; a3: row g+8), B's b0 / b1 [T] int32 pairs -> D as the lanes' C entries [T, 4]."""
    b0v = tl.join(_half(b0, False), _half(b0, True)).reshape(W, 8, 4, 2)  # B[2t+e, n = g]
    b1v = tl.join(_half(b1, False), _half(b1, True)).reshape(W, 8, 4, 2)  # B[8+2t+e, n = g]
    # D[row, n] = sum_{t, e} A[row, kappa] B[kappa, n]: rows [W, 8, 1, 4, 2] against n [W, 1, 8, 4, 2]
    top = tl.sum(tl.sum(a_lt[:, :, None] * b0v[:, None] + a_ht[:, :, None] * b1v[:, None], axis=4), axis=3)
    bot = tl.sum(tl.sum(a_lb[:, :, None] * b0v[:, None] + a_hb[:, :, None] * b1v[:, None], axis=4), axis=3)
    # lane (g, t) holds D[g, 2t + e'] (c0, c1) and D[g + 8, 2t + e'] (c2, c3)
    d = tl.join(top.reshape(W, 8, 4, 2), bot.reshape(W, 8, 4, 2))  # [W, 8, 4, e', h]
    return tl.permute(d, (0, 1, 2, 4, 3)).reshape(W * 32, 4)


@triton.jit
def _col(v, jj: tl.constexpr):
    """Column jj of a [T, 4] tensor as [T] (interpreter only)."""
    return tl.sum(tl.where(tl.arange(0, 4)[None, :] == jj, v, 0), axis=1)


@triton.jit
def _emu_nib(word, lo: tl.constexpr, hi: tl.constexpr, mult: tl.constexpr, W: tl.constexpr):
    """A register of nibbles lo (low half) and hi (high half) as 1024 + mult * q, [W, 8, 4, 2]."""
    q = tl.join((word >> (4 * lo)) & 15, (word >> (4 * hi)) & 15).to(tl.float32)
    return (1024.0 + mult * q).reshape(W, 8, 4, 2)


@triton.jit
def _mma4(words, b0, b1, c, W: tl.constexpr, ONES: tl.constexpr, ASM: tl.constexpr):
    """Four mmas over the lanes' [T, 4] registers (see `_mma4_asm`); ONES: A = 1.0 (words unused)."""
    if ASM:
        if ONES:
            return tl.inline_asm_elementwise(_MMA_ONES, "=f,=f,=f,=f,r,r,r,r,r,r,r,r,r,r,r,r,f,f,f,f",
                                             [words, b0, b1, c], dtype=tl.float32, is_pure=True, pack=4)
        return tl.inline_asm_elementwise(_MMA4, "=f,=f,=f,=f,r,r,r,r,r,r,r,r,r,r,r,r,f,f,f,f",
                                         [words, b0, b1, c], dtype=tl.float32, is_pure=True, pack=4)
    else:
        for jj in tl.static_range(4):
            w = _col(words, jj)
            if ONES:
                one = tl.full([W, 8, 4, 2], 1.0, tl.float32)
                d = _emu_mma(one, one, one, one, _col(b0, jj), _col(b1, jj), W)
            else:
                d = _emu_mma(_emu_nib(w, 0, 4, 1.0, W), _emu_nib(w, 2, 6, 1.0, W), _emu_nib(w, 1, 5, 16.0, W),
                             _emu_nib(w, 3, 7, 16.0, W), _col(b0, jj), _col(b1, jj), W)
            c = c + d
        return c


@triton.jit
def _warp_max(v, W: tl.constexpr, ASM: tl.constexpr):
    """[T] -> the max over each warp's 32 lanes, in every lane (butterfly shuffles: no barrier)."""
    if ASM:
        return tl.inline_asm_elementwise(_WARP_MAX, "=f,f", [v], dtype=tl.float32, is_pure=True, pack=1)
    else:
        m = tl.max(tl.reshape(v, [W, 32]), axis=1)
        return tl.reshape(tl.broadcast_to(m[:, None], [W, 32]), [W * 32])


@triton.jit
def _pairs(v, keep):
    """[T, 8] fp32 (already in fp16's range) -> [T, 4] int32 fp16 pairs, 0 where not keep [T, 1]."""
    lo, hi = tl.split(tl.reshape(v, [v.shape[0], 4, 2]))
    return tl.where(keep, _h2(lo, hi), 0)


@triton.jit
def _ld(ptrs, m, MASKED: tl.constexpr, WC: tl.constexpr):
    """A weight-stream load (masked by m if MASKED) with W4MmaConfig.weight_cache's hint: 0 none, 1 `.cg` (not
    allocated in L1), 2 evict-first (PTX combines neither with the other)."""
    cm: tl.constexpr = ".cg" if WC == 1 else ""
    ev: tl.constexpr = "evict_first" if WC == 2 else ""
    if MASKED:
        return tl.load(ptrs, mask=m, other=0, cache_modifier=cm, eviction_policy=ev)
    return tl.load(ptrs, cache_modifier=cm, eviction_policy=ev)


@triton.jit
def _load_tile(w_ptrs, s_ptrs, ok, EVEN: tl.constexpr, WC: tl.constexpr = 0):
    """A warp's tile: its four 16-byte word loads and its scales' (masked unless EVEN: ok [T] says which
    warps' tiles lie inside the weight; WC: `_ld`'s cache hints)."""
    m = ok[:, None]
    M: tl.constexpr = not EVEN
    return (_ld(w_ptrs, m, M, WC), _ld(w_ptrs + 128, m, M, WC), _ld(w_ptrs + 256, m, M, WC),
            _ld(w_ptrs + 384, m, M, WC), _ld(s_ptrs, m, M, WC))


@triton.jit
def _hint_tile(w_ptr, sz_ptr, block_tile0, row_tile, last_rt, lane):
    """Ask the L2 for each warp's row tile `row_tile` [T] of the program's 256-column block (clamped to the
    chunk's last, so a hint past the chunk's end repeats a line of its own): lanes 0-15 its 16 weight lines
    of 128 bytes, lanes 16-31 its 4 scale lines (each 4 times). CUDA only."""
    tile = (block_tile0 + tl.minimum(row_tile, last_rt)).to(tl.int64)
    prefetch_l2(tl.where(lane < 16, w_ptr + tile * 512 + lane * 32, sz_ptr + tile * 128 + (lane % 4) * 32), False)


@triton.jit
def _tile(p0, p1, p2, p3, sc, b_a0, b_b0, b_a1, b_b1, b_a2, b_b2, b_a3, b_b3, c_init, xz, unscale, ws_row, out, keep,
          W: tl.constexpr, ASM: tl.constexpr):
    """One row tile per warp over the block: 16 mmas, the (scale, zero) per entry, the rows' sums to
    the workspace: lane t == 0 of each g stores its rows g and g + 8 at `out` [T, 2] (adjacent: the
    workspace's PAIRED order) where `keep`."""
    d = _mma4(p0, b_a0, b_b0, c_init, W, False, ASM)
    d = _mma4(p1, b_a1, b_b1, d, W, False, ASM)
    d = _mma4(p2, b_a2, b_b2, d, W, False, ASM)
    d = _mma4(p3, b_a3, b_b3, d, W, False, ASM)
    s = (sc << 16).to(tl.float32, bitcast=True)  # bf16 scale in the low half, zero in the high
    z = (sc & -65536).to(tl.float32, bitcast=True)
    r = _row_sums(d * s + z * xz, W, ASM)  # [T, 4]: lane (g, t)'s (row, group) entries -> rows g, g, g+8, g+8
    rows, _ = tl.split(tl.reshape(r, [W * 32, 2, 2]))  # [T, 2]: rows g, g + 8
    tl.store(ws_row + out, rows * unscale, mask=keep)


@triton.jit
def _use_tile(p0, p1, p2, p3, sc, b_a0, b_b0, b_a1, b_b1, b_a2, b_b2, b_a3, b_b3, c_init, xz, unscale, ws_row, out,
              keep, junk, W: tl.constexpr, ASM: tl.constexpr, LOADS_ONLY: tl.constexpr):
    """One loaded tile into the workspace (`_tile`), or with LOADS_ONLY (the memory-stream probe) only XORed
    into `junk`, which keeps its loads alive; -> junk."""
    if LOADS_ONLY:
        junk = junk ^ p0 ^ p1 ^ p2 ^ p3 ^ sc
    else:
        _tile(p0, p1, p2, p3, sc, b_a0, b_b0, b_a1, b_b1, b_a2, b_b2, b_a3, b_b3, c_init, xz, unscale, ws_row, out,
              keep, W, ASM)
    return junk


@triton.jit
def _row_sums(r, W: tl.constexpr, ASM: tl.constexpr):
    """[T, 4] (row, group) entries -> each lane's rows g (entries 0, 1) and g + 8 (2, 3) summed over
    the row's 8 entries (its two, then the 4 lanes t of its g: butterfly shuffles in registers)."""
    if ASM:
        return tl.inline_asm_elementwise(_ROW_SUMS, "=f,=f,=f,=f,f,f,f,f", [r], dtype=tl.float32, is_pure=True,
                                         pack=4)
    else:
        r5 = tl.reshape(r, [W, 8, 4, 2, 2])  # [warp, g, t, h (row g + 8 h), e (group 2 t + e)]
        rs = tl.sum(tl.sum(r5, axis=4), axis=2)  # [W, 8, 2]
        rs = tl.broadcast_to(rs[:, :, None, :], [W, 8, 4, 2])
        return tl.reshape(tl.join(rs, rs), [W * 32, 4])


@triton.jit
def _operands(v0, v1, v2, v3, dummy, is_a, is_b, t, W: tl.constexpr, ASM: tl.constexpr):
    """A K slice's mma operands from the lanes' inputs (v0..v3 [T, 8] fp32, their columns 0-7, 8-15, 16-23,
    24-31 of the lane's group): B's fp16 pairs (b_a*: lanes g == t, b_b*: g == t + 4, x / 16), the
    accumulators' start and the zero term's input sums, and the power of two that undoes the inputs'
    scaling. dummy: any [T, 4] int32 (the ones-mma's unused words operand)."""
    # each warp scales its own fragments (its sums are its own): a warp-wide max, no barrier
    m = tl.maximum(tl.maximum(tl.max(tl.abs(v0), axis=1), tl.max(tl.abs(v1), axis=1)),
                   tl.maximum(tl.max(tl.abs(v2), axis=1), tl.max(tl.abs(v3), axis=1)))
    m = _warp_max(m, W, ASM)
    # 2^d with max |x| 2^d in [2^13, 2^14): fp16 holds every input, /16 included, without overflow
    em = tl.minimum(tl.maximum((m.to(tl.int32, bitcast=True) >> 23) & 0xFF, 24), 254)
    up = ((267 - em) << 23).to(tl.float32, bitcast=True)[:, None]
    unscale = ((em - 13) << 23).to(tl.float32, bitcast=True)[:, None]
    f = tl.where(is_b, up * 0.0625, up)
    b_a0, b_b0 = _pairs(v0 * f, is_a), _pairs(v0 * f, is_b)
    b_a1, b_b1 = _pairs(v1 * f, is_a), _pairs(v1 * f, is_b)
    b_a2, b_b2 = _pairs(v2 * f, is_a), _pairs(v2 * f, is_b)
    b_a3, b_b3 = _pairs(v3 * f, is_a), _pairs(v3 * f, is_b)
    # Y[n] = sum of group n's fp16 inputs as fed (hi groups: / 16), in every lane's entries (groups
    # 2t, 2t + 1): the accumulators start at -(1024 + 8) Y (lo groups) or -(1024 + 128) Y (hi: x / 16
    # against 1024 + 16 q), and the zero term is zero * X with X = Y (lo) or 16 Y (hi)
    zero4 = tl.zeros(dummy.shape, dtype=tl.float32)
    y = _mma4(dummy, b_a0, b_b0, zero4, W, True, ASM)
    y = _mma4(dummy, b_a1, b_b1, y, W, True, ASM)
    y = _mma4(dummy, b_a2, b_b2, y, W, True, ASM)
    y = _mma4(dummy, b_a3, b_b3, y, W, True, ASM)
    hi_grp = (t >= 2)[:, None]
    c_init = y * tl.where(hi_grp, -1152.0, -1032.0)
    xz = y * tl.where(hi_grp, 16.0, 1.0)
    return b_a0, b_b0, b_a1, b_b1, b_a2, b_b2, b_a3, b_b3, c_init, xz, unscale


@triton.jit
def _lane_roles(g, t, pid_k):
    """The lanes' roles in their K slice's operands (g = lane // 4, t = lane % 4): B's lanes g == t carry group
    t's 32 inputs (b0), lanes g == t + 4 group t + 4's (b1, divided by 16) -> (is_a, is_b, the first of each
    lane's columns [T, 8], whether it loads them)."""
    is_a = (g == t)[:, None]
    is_b = (g == t + 4)[:, None]
    grp = tl.where(g == t, t, t + 4)
    col0 = (pid_k * 256 + 32 * grp)[:, None] + tl.arange(0, 8)[None, :]
    return is_a, is_b, col0, is_a | is_b


@triton.jit
def _slice_inputs(x_ptr, g_ptr, xs, col0, use, pid_k, K, eps, norm_k, PRO: tl.constexpr, NORM_BLOCK: tl.constexpr,
                  MS: tl.constexpr, MSP: tl.constexpr, MD: tl.constexpr, dt: tl.constexpr):
    """The lanes' inputs of K slice pid_k through the product's prologue -> v0..v3 [T, 8] fp32, the lane's
    columns col0 + 0-7, 8-15, 16-23, 24-31 (xs: the program's 256-element scratch row, PRO_MERGE only). The
    inputs' loads first, then the norm's 1 / rms (its reduction waits at a barrier), then the prologue."""
    src = x_ptr
    if PRO == 3:
        # attention's split partials: the block's 256 columns merged at once into the scratch row, rounded to
        # the activation dtype as attention stores its output, then every lane loads its own columns from it as
        # from a plain x. The operands must come from 16-byte loads of this shape: the warp shuffles
        # (`_warp_max`) and the mma need thread i to hold row i of every [T, 8] operand, the layout Triton gives
        # such loads. A gather's result (or fp32 rows, 32 bytes) got another layout, and compiled on the H200
        # the product was 5.6% off while the interpreter matched
        tl.store(xs + tl.arange(0, 256), _rnd(_x_merge(x_ptr, g_ptr, pid_k * 256, K, 256, MS, MSP, MD), dt).to(dt))
        tl.debug_barrier()  # the row is stored: visible to every thread of the program
        src = xs - pid_k * 256
    a0, e0 = _x_load(src, g_ptr, col0, use, K, PRO)
    a1, e1 = _x_load(src, g_ptr, col0 + 8, use, K, PRO)
    a2, e2 = _x_load(src, g_ptr, col0 + 16, use, K, PRO)
    a3, e3 = _x_load(src, g_ptr, col0 + 24, use, K, PRO)
    inv = 1.0
    if PRO == 1:
        inv = _norm_inv(x_ptr, K, norm_k, eps, NORM_BLOCK)
    v0, v1 = _x_apply(a0, e0, inv, PRO, dt), _x_apply(a1, e1, inv, PRO, dt)
    v2, v3 = _x_apply(a2, e2, inv, PRO, dt), _x_apply(a3, e3, inv, PRO, dt)
    return v0, v1, v2, v3


@triton.jit
def _w4_mma_kernel(
    x_ptr, g_ptr, w_ptr, sz_ptr, r_ptr, y_ptr, ws_ptr, cnt_ptr, xs_ptr,
    N, K, NT, eps, norm_k,
    cos_ptr, sin_ptr, kp_ptr, vp_ptr, slot_ptr, s_kslot, s_kh, s_vslot, s_vh, n_q, n_qk,
    PRO: tl.constexpr, RESIDUAL: tl.constexpr, ROPE_KV: tl.constexpr, HALF: tl.constexpr, PP: tl.constexpr,
    NB: tl.constexpr, W: tl.constexpr, PDL: tl.constexpr, ASM: tl.constexpr, NSPLIT: tl.constexpr,
    NORM_BLOCK: tl.constexpr, EVEN: tl.constexpr, LATE_LAUNCH: tl.constexpr = False, PF: tl.constexpr = 1,
    LOADS_ONLY: tl.constexpr = False, STAGES: tl.constexpr = 1, K_MAJOR: tl.constexpr = False,
    MS: tl.constexpr = 1, MSP: tl.constexpr = 1, MD: tl.constexpr = 1, L2A: tl.constexpr = 0,
    L2F: tl.constexpr = 0, WC: tl.constexpr = 0, op_ptr=None, OPS: tl.constexpr = False,
):
    if K_MAJOR:  # a chunk's K slices launch together: chunks finish (and their last program adds) all along
        pid_k = tl.program_id(0)
        pid_n = tl.program_id(1)
    else:
        pid_n = tl.program_id(0)
        pid_k = tl.program_id(1)
    dt = y_ptr.dtype.element_ty
    T: tl.constexpr = 32 * W
    TILES: tl.constexpr = NB // 16 // W  # row tiles per warp
    i = tl.arange(0, T)
    lane = i % 32
    warp = i // 32
    g = lane // 4
    t = lane % 4
    jj = tl.arange(0, 4)
    # a warp's row tiles: rt0 + warp, + W, ...; a block's tiles are contiguous
    rt = pid_n * (NB // 16) + warp
    tile = (pid_k * NT + rt).to(tl.int64)
    w_ptrs = w_ptr + tile[:, None] * 512 + (lane * 4)[:, None] + jj[None, :]
    s_ptrs = sz_ptr + tile[:, None] * 128 + (lane * 4)[:, None] + jj[None, :]
    W_STEP: tl.constexpr = W * 512
    S_STEP: tl.constexpr = W * 128
    last_rt = tl.minimum(NT, pid_n * (NB // 16) + NB // 16) - 1  # the chunk's last row tile (L2A's clamp)
    if STAGES == 1:  # the warp's first PF tiles in flight before the PDL wait (STAGES > 1 loads all in its loop)
        p0, p1, p2, p3, sc = _load_tile(w_ptrs, s_ptrs, rt < NT, EVEN, WC)
        if PF >= 2:
            q0, q1, q2, q3, sq = _load_tile(w_ptrs + W_STEP, s_ptrs + S_STEP, rt + W < NT, False, WC)
        if PF >= 3:
            u0, u1, u2, u3, su = _load_tile(w_ptrs + 2 * W_STEP, s_ptrs + 2 * S_STEP, rt + 2 * W < NT, False, WC)
        if PF >= 4:
            h0, h1, h2, h3, sh = _load_tile(w_ptrs + 3 * W_STEP, s_ptrs + 3 * S_STEP, rt + 3 * W < NT, False, WC)
    if ASM:  # the L2 asked for the next L2F tiles before the wait (hints: no registers)
        for j in tl.static_range(L2F):
            _hint_tile(w_ptr, sz_ptr, pid_k * NT, rt + ((PF if STAGES == 1 else 0) + j) * W, last_rt, lane)
    if PDL:
        tl.extra.cuda.gdc_wait()  # x, r, the workspace and the counters belong to the previous kernel until here
        if not LATE_LAUNCH:
            tl.extra.cuda.gdc_launch_dependents()
    is_a, is_b, col0, use = _lane_roles(g, t, pid_k)
    if OPS:  # the operands as `gluon_gemv_w4m._prep_kernel` left them (the CPU check of its buffer's contract)
        ob = op_ptr + pid_k * (11 * 128) + (lane * 4)[:, None] + jj[None, :]
        b_a0, b_b0, b_a1, b_b1 = tl.load(ob), tl.load(ob + 128), tl.load(ob + 256), tl.load(ob + 384)
        b_a2, b_b2, b_a3, b_b3 = tl.load(ob + 512), tl.load(ob + 640), tl.load(ob + 768), tl.load(ob + 896)
        c_init = tl.load(ob + 1024).to(tl.float32, bitcast=True)
        xz = tl.load(ob + 1152).to(tl.float32, bitcast=True)
        # [T, 1], as `_operands` leaves it: the lane's first word (all four hold it)
        unscale = tl.load(op_ptr + pid_k * (11 * 128) + 1280 + (lane * 4)[:, None]).to(tl.float32, bitcast=True)
    else:
        v0, v1, v2, v3 = _slice_inputs(x_ptr, g_ptr, xs_ptr + (pid_n * NSPLIT + pid_k) * 256, col0, use, pid_k, K,
                                       eps, norm_k, PRO, NORM_BLOCK, MS, MSP, MD, dt)
        dummy = p0 if STAGES == 1 else tl.zeros([T, 4], dtype=tl.int32)  # the ones-mma's unused words operand
        b_a0, b_b0, b_a1, b_b1, b_a2, b_b2, b_a3, b_b3, c_init, xz, unscale = _operands(
            v0, v1, v2, v3, dummy, is_a, is_b, t, W, ASM)
    # where a tile's sums go, [T, 2]: lane t == 0 of each g stores rows g and g + 8, adjacent in the
    # workspace (its PAIRED order: a tile's rows 0, 8, 1, 9, ...)
    out = rt[:, None] * 16 + 2 * g[:, None] + tl.arange(0, 2)[None, :]
    first = (t == 0)[:, None]
    ws_row = ws_ptr + pid_k * N
    keep = first if EVEN else first & (out < N)
    junk = tl.zeros([T, 4], dtype=tl.int32)  # LOADS_ONLY: what keeps the loads alive
    if STAGES > 1:  # every tile loaded in its own iteration, STAGES - 1 ahead through shared memory (cp.async)
        for it in tl.range(0, TILES, num_stages=STAGES):
            t0, t1, t2, t3, st = _load_tile(w_ptrs + it * W_STEP, s_ptrs + it * S_STEP, rt + it * W < NT, EVEN, WC)
            okt = first if EVEN else first & (out + it * 16 * W < N)
            junk = _use_tile(t0, t1, t2, t3, st, b_a0, b_b0, b_a1, b_b1, b_a2, b_b2, b_a3, b_b3,
                             c_init, xz, unscale, ws_row, out + it * 16 * W, okt, junk, W, ASM, LOADS_ONLY)
    else:
        w_ptrs += (PF - 1) * W_STEP
        s_ptrs += (PF - 1) * S_STEP
        # the warp's next PF tiles in flight while one is used (a rotation p <- q <- u <- h <- new); the
        # last PF peeled off the loop
        for it in range(TILES - PF):
            w_ptrs += W_STEP
            s_ptrs += S_STEP
            n0, n1, n2, n3, scn = _load_tile(w_ptrs, s_ptrs, rt + (it + PF) * W < NT, EVEN, WC)
            if L2A > 0 and ASM:  # past the chunk's end: its last tile again (an L2 hit, never another's bytes)
                _hint_tile(w_ptr, sz_ptr, pid_k * NT, rt + (it + PF + L2A) * W, last_rt, lane)
            junk = _use_tile(p0, p1, p2, p3, sc, b_a0, b_b0, b_a1, b_b1, b_a2, b_b2, b_a3, b_b3,
                             c_init, xz, unscale, ws_row, out, keep, junk, W, ASM, LOADS_ONLY)
            if PF == 1:
                p0, p1, p2, p3, sc = n0, n1, n2, n3, scn
            elif PF == 2:
                p0, p1, p2, p3, sc = q0, q1, q2, q3, sq
                q0, q1, q2, q3, sq = n0, n1, n2, n3, scn
            elif PF == 3:
                p0, p1, p2, p3, sc = q0, q1, q2, q3, sq
                q0, q1, q2, q3, sq = u0, u1, u2, u3, su
                u0, u1, u2, u3, su = n0, n1, n2, n3, scn
            else:
                p0, p1, p2, p3, sc = q0, q1, q2, q3, sq
                q0, q1, q2, q3, sq = u0, u1, u2, u3, su
                u0, u1, u2, u3, su = h0, h1, h2, h3, sh
                h0, h1, h2, h3, sh = n0, n1, n2, n3, scn
            out += 16 * W
            keep = first if EVEN else first & (out < N)
        # the last PF tiles, oldest first: the same rotation with nothing loaded behind them
        for j in tl.static_range(PF):
            if j > 0:
                out += 16 * W
                keep = first if EVEN else first & (out < N)
            junk = _use_tile(p0, p1, p2, p3, sc, b_a0, b_b0, b_a1, b_b1, b_a2, b_b2, b_a3, b_b3,
                             c_init, xz, unscale, ws_row, out, keep, junk, W, ASM, LOADS_ONLY)
            if PF >= 2:
                p0, p1, p2, p3, sc = q0, q1, q2, q3, sq
            if PF >= 3:
                q0, q1, q2, q3, sq = u0, u1, u2, u3, su
            if PF >= 4:
                u0, u1, u2, u3, su = h0, h1, h2, h3, sh
    if LOADS_ONLY:  # one word per program, so nothing above is dead code
        tl.store(ws_row + pid_n * NB, tl.sum(tl.sum(junk, axis=1), axis=0).to(tl.float32, bitcast=True))
    if PDL and LATE_LAUNCH:
        tl.extra.cuda.gdc_launch_dependents()
    _finish(ws_ptr, cnt_ptr, r_ptr, y_ptr, N, pid_n, NSPLIT, pid_n * NB, cos_ptr, sin_ptr, kp_ptr, vp_ptr, slot_ptr,
            s_kslot, s_kh, s_vslot, s_vh, n_q, n_qk, RESIDUAL, ROPE_KV, HALF, PP, NB, dt, PAIRED=True)


def launch(x: torch.Tensor, g: torch.Tensor, w: torch.Tensor, sz: torch.Tensor, r: torch.Tensor, y: torch.Tensor,
           n: int, k: int, eps: float, rope_args: tuple, *, pro: int, residual: bool, rope_kv: bool, half: int,
           cfg: W4MmaConfig | None, pdl: bool, loads_only: bool = False, merge: tuple[int, int] = (1, 1),
           ops: torch.Tensor | None = None) -> None:
    """`_w4_mma_kernel` over (row chunks, 256-column blocks); arguments as `triton_gemv._launch` prepares
    them, w and sz as `pack` leaves them. loads_only: a probe of the kernel's memory stream alone (the same
    loads, no products: its output is garbage; benchmarks only). merge: (splits, head width) of PRO_MERGE's
    partials (`triton_gemv.gemv(merge_ml=...)`). ops: the operands from `gluon_gemv_w4m.prep` instead of
    the kernel's own (tests of that buffer). cfg.gluon > 0 launches `gluon_gemv_w4m` where it runs."""
    cfg = cfg or default_config(n, k)
    # the lanes' [T, 8] input loads must be 16-byte vectors, which Triton emits only for 16-byte aligned
    # pointers: that is what gives thread i row i of every operand, as the warp shuffles and the mma need
    # (unaligned, the loads spread a row over 8 threads and the products come out wrong). A view that
    # starts off a 16-byte boundary is copied
    if pro != 3:
        x = x if x.data_ptr() % 16 == 0 else x.clone()
        g = g if g.data_ptr() % 16 == 0 else g.clone()
    if pro == 3 and 256 % merge[1]:
        raise ValueError(f"gemv: the mma int4 GEMV merges heads whose width divides 256, got {merge[1]}")
    if cfg.gluon not in (0, 2, 4, 8):
        raise ValueError(f"gemv: the mma int4 GEMV's gluon stages are 0 (the Triton kernel), 2, 4 or 8, got {cfg}")
    compiled = x.device.type == "cuda" and os.environ.get("TRITON_INTERPRET") != "1"
    if cfg.gluon and compiled and not loads_only and ops is None:
        from augury.layers import gluon_gemv_w4m

        if gluon_gemv_w4m.fits(n, k, cfg, rope_kv, half):
            gluon_gemv_w4m.launch(x, g, w, sz, r, y, n, k, eps, rope_args, pro=pro, residual=residual,
                                  rope_kv=rope_kv, half=half, cfg=cfg, pdl=pdl, merge=merge)
            return
    _, nb = row_chunks(n, cfg, rope_kv, half, pow2=False)
    if nb % (16 * cfg.num_warps):
        raise ValueError(f"gemv: the mma int4 GEMV needs rows_per_program a multiple of 16 x num_warps, got "
                         f"{nb} rows for {cfg}")
    if cfg.weight_cache not in (0, 1, 2):
        raise ValueError(f"gemv: the mma int4 GEMV's weight_cache is 0 (none), 1 (.cg) or 2 (evict-first), got {cfg}")
    if cfg.prefetch not in (1, 2, 3, 4):
        raise ValueError(f"gemv: the mma int4 GEMV prefetches 1 to 4 tiles, got {cfg}")
    grid = (triton.cdiv(n, nb), k // MMA_COLS)
    ws, cnt = _workspace(x.device, grid[1] * n, grid[0])
    opts = {"launch_pdl": True} if pdl else {}
    if cfg.maxnreg and compiled:
        opts["maxnreg"] = cfg.maxnreg
    if cfg.persistent:
        from augury.layers import triton_gemv_w4m_stream as stream

        if cfg.stages != 1 or cfg.late_launch:
            raise ValueError(f"gemv: the persistent mma int4 GEMV keeps its tiles in registers and launches its "
                             f"dependents at its wait (stages=1, late_launch=0), got {cfg}")
        if stream.fits(n, cfg.num_warps, pro):
            progs = min(cfg.persistent * stream.multiprocessors(x.device), stream.steps(n, k, cfg.num_warps))
            pieces = stream.pieces(n, k, cfg.num_warps, nb, progs)
            stream._w4_mma_stream_kernel[(progs,)](
                x, g, w, sz, r, y, ws, cnt, n, k, n // MMA_ROWS, eps, float(k), *rope_args,
                PRO=pro, RESIDUAL=residual, ROPE_KV=rope_kv, HALF=half, PP=min(64, half & -half), NB=nb,
                W=cfg.num_warps, PDL=pdl, ASM=compiled, NSPLIT=grid[1], NORM_BLOCK=min(triton.next_power_of_2(k), 4096),
                PIECES=pieces, PF=cfg.prefetch, LOADS_ONLY=loads_only, WC=cfg.weight_cache, num_warps=cfg.num_warps, num_stages=1, **opts,
            )
            return
        # shapes whose steps would straddle K slices, and the merge prologue: the grid form below
    pf = min(cfg.prefetch, nb // (16 * cfg.num_warps))
    # PRO_MERGE: a 256-column row a program for its merged input, in the activation dtype
    xs = torch.empty(grid[0] * grid[1] * MMA_COLS, dtype=y.dtype, device=x.device) if pro == 3 else ws
    _w4_mma_kernel[(grid[1], grid[0]) if cfg.k_major else grid](
        x, g, w, sz, r, y, ws, cnt, xs, n, k, n // MMA_ROWS, eps, float(k), *rope_args,
        PRO=pro, RESIDUAL=residual, ROPE_KV=rope_kv, HALF=half, PP=min(64, half & -half), NB=nb, W=cfg.num_warps,
        PDL=pdl, ASM=compiled, NSPLIT=grid[1], NORM_BLOCK=min(triton.next_power_of_2(k), 4096), EVEN=n % nb == 0,
        LATE_LAUNCH=cfg.late_launch, PF=pf, LOADS_ONLY=loads_only, STAGES=cfg.stages, K_MAJOR=cfg.k_major,
        MS=merge[0], MSP=triton.next_power_of_2(merge[0]), MD=merge[1], L2A=cfg.l2_ahead if cfg.stages == 1 else 0,
        L2F=cfg.l2_first, WC=cfg.weight_cache, op_ptr=ws if ops is None else ops, OPS=ops is not None,
        num_warps=cfg.num_warps, num_stages=1, **opts,
    )
