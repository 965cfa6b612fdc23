"""The tensor-core int4 GEMV (`triton_gemv_w4m`) with its weight stream staged through shared memory, in Gluon.

Why: the Triton kernel keeps the tiles it has in flight in registers (2 a warp at 128 registers), and Triton's own
software pipeliner (`W4MmaConfig.stages`) put a whole-program barrier in every loop step and was slower (fortieth
and forty-first sessions). Here each thread copies its own 16-byte pieces of a tile by cp.async and later reads
back exactly those bytes, so only its own `cp.async.wait_group` stands between a copy and its use, and the bytes in
flight are bounded by shared memory (stages x 2.5 KB a warp), not by registers. On an H100 the loop alone (operands
precomputed, no finish) read 1.07x (gate_up) to 1.64x (o_proj) of the Triton kernel per product (forty-fourth
session, docs/data/gpu44/call1).

A product is two launches:
1. `_prep_kernel` (Triton, one warp a 256-column K slice): the prologue (norm, SiLU-mul or attention's merge) and
   the slice's mma operands, `triton_gemv_w4m._operands` itself, stored lane-major in a small buffer [K / 256,
   N_OPS, 32, 4] int32. Computing them once a slice, not once a program, also takes that work out of the product.
2. `_g4m_kernel` (Gluon): the weight tiles' cp.async copies first (under PDL: before the wait), then the operands'
   loads, the same per-tile math (the same inline PTX) into the split-K workspace in its PAIRED order, and the
   same finish: the last program of a row chunk adds the slices in slice order and applies the epilogue
   (residual, or rope and the K/V pool writes).

CUDA only: Gluon has no interpreter, so CI checks the operand buffer's contract on the CPU through the Triton
kernel's `OPS` mode (`_w4_mma_kernel` fed by `_prep_kernel`) and compiles this kernel for sm_90 offline; the CUDA
tests check it against the Triton one, within one bf16 rounding step (on the H100 one qkv output was a step off:
the tile's fp32 math contracts into FMAs differently). Opt-in per product: `W4MmaConfig.gluon` = the stages (2, 4
or 8). Measured slower in the engine (forty-fourth session, H100): int4 B=1 327.6 / 327.7 against 413.3 / 412.9
tok/s, the layer chain 91.7-93.3 against 72.2-72.4 us, every product slower in it (qkv +2.1 ... down +14.3 us).
Where the probe's gain went is not measured yet; what differs from the probe is the prep launch in front of every
product (a second grid to wait for) and the finish (one-warp programs adding down's 56 slices)."""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from augury.layers import triton_gemv_w4m as M
from augury.layers.int4_layout import MMA_COLS, MMA_ROWS
from augury.layers.triton_gemv import _rnd, _rope_kv_store
from augury.layers.triton_gemv_w4 import _rows_store, _workspace, row_chunks

try:  # Gluon is experimental: a Triton without it (or with another API) keeps the Triton kernel
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy as ac
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

    # Triton 3.9 names these async_load / barrier; 3.6 (the device image's) async_copy_global_to_shared /
    # thread_barrier
    _async_load = getattr(ac, "async_load", None) or ac.async_copy_global_to_shared
    _barrier = getattr(gl, "barrier", None) or gl.thread_barrier
    AVAILABLE = True
except (ImportError, AttributeError):  # pragma: no cover - depends on the installed Triton
    AVAILABLE = False

_MMA4_ASM = M._MMA4
_ROW_SUMS_ASM = M._ROW_SUMS
N_OPS = 11  # b_a0, b_b0, ..., b_a3, b_b3, c_init, xz, unscale: each [32 lanes, 4] words
STAGES = (2, 4, 8)  # Gluon's shared-memory shapes are powers of two


@triton.jit
def _prep_kernel(x_ptr, g_ptr, op_ptr, xs_ptr, y_ptr, K, eps, norm_k, PRO: tl.constexpr, NORM_BLOCK: tl.constexpr,
                 MS: tl.constexpr, MSP: tl.constexpr, MD: tl.constexpr, PDL: tl.constexpr, ASM: tl.constexpr):
    """One warp a 256-column slice: the product's prologue on the slice's inputs and their mma operands, as
    `_w4_mma_kernel` computes them before its loop (the same helpers, one warp), stored lane-major."""
    pid_k = tl.program_id(0)
    if PDL:  # x (and the norm's row, the merge's partials) belong to the previous kernel until here
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()  # the product's weight copies need nothing of this kernel
    i = tl.arange(0, 32)
    g = i // 4
    t = i % 4
    is_a, is_b, col0, use = M._lane_roles(g, t, pid_k)
    v0, v1, v2, v3 = M._slice_inputs(x_ptr, g_ptr, xs_ptr + pid_k * 256, col0, use, pid_k, K, eps, norm_k, PRO,
                                     NORM_BLOCK, MS, MSP, MD, y_ptr.dtype.element_ty)
    ops = M._operands(v0, v1, v2, v3, tl.zeros([32, 4], dtype=tl.int32), is_a, is_b, t, 1, ASM)
    base = op_ptr + pid_k * (11 * 128) + (i * 4)[:, None] + tl.arange(0, 4)[None, :]
    for j in tl.static_range(8):
        tl.store(base + j * 128, ops[j])
    tl.store(base + 8 * 128, ops[8].to(tl.int32, bitcast=True))
    tl.store(base + 9 * 128, ops[9].to(tl.int32, bitcast=True))
    tl.store(base + 10 * 128, tl.broadcast_to(ops[10], [32, 4]).to(tl.int32, bitcast=True))


def prep(x: torch.Tensor, g: torch.Tensor, y: torch.Tensor, k: int, eps: float, *, pro: int, pdl: bool,
         merge: tuple[int, int] = (1, 1)) -> torch.Tensor:
    """`_prep_kernel` over the K slices -> the operand buffer [K / 256, N_OPS, 32, 4] int32 (y: the product's
    output, for its dtype only)."""
    op = torch.empty(k // MMA_COLS, N_OPS, 32, 4, dtype=torch.int32, device=x.device)
    xs = torch.empty(k, dtype=y.dtype, device=x.device) if pro == 3 else y
    compiled = x.device.type == "cuda" and os.environ.get("TRITON_INTERPRET") != "1"
    _prep_kernel[(k // MMA_COLS,)](x, g, op, xs, y, k, eps, float(k), PRO=pro, NORM_BLOCK=min(triton.next_power_of_2(k), 4096),
                                   MS=merge[0], MSP=triton.next_power_of_2(merge[0]), MD=merge[1], PDL=pdl, ASM=compiled,
                                   num_warps=1, **({"launch_pdl": True} if pdl else {}))
    return op


if AVAILABLE:
    @gluon.jit
    def _mma4(words, b0, b1, c):
        return gl.inline_asm_elementwise(_MMA4_ASM, "=f,=f,=f,=f,r,r,r,r,r,r,r,r,r,r,r,r,f,f,f,f", [words, b0, b1, c],
                                         dtype=gl.float32, is_pure=True, pack=4)

    @gluon.jit
    def _issue(wbuf, sbuf, w_ptrs, s_ptrs, st, WC: gl.constexpr):
        """A warp's tile into stage st: its four 16-byte weight pieces and its scales' (each thread its own)."""
        ev: gl.constexpr = "evict_first" if WC == 2 else ""
        for k in gl.static_range(4):
            _async_load(wbuf.index(st * 4 + k), w_ptrs + 128 * k, eviction_policy=ev)
        _async_load(sbuf.index(st), s_ptrs, eviction_policy=ev)

    @gluon.jit
    def _slice_sum(ws_ptr, N, rows, ok, NSPLIT: gl.constexpr, L1: gl.constexpr):
        """`triton_gemv_w4._slice_sum` (PAIRED): the slices' partial sums of `rows`, added in slice order."""
        rows = rows // 16 * 16 + 2 * (rows % 8) + (rows % 16) // 8
        acc = gl.full(rows.shape, 0.0, gl.float32, L1)
        for s_i in gl.static_range(NSPLIT):
            acc += gl.load(ws_ptr + s_i * N + rows, mask=ok, other=0.0, cache_modifier=".cg")
        return acc

    @gluon.jit
    def _epilogue(ws_ptr, r_ptr, y_ptr, N, pid_n, cos_ptr, sin_ptr, kp_ptr, vp_ptr, slot_ptr, s_kslot, s_kh,
                  s_vslot, s_vh, n_q, n_qk, NSPLIT: gl.constexpr, RESIDUAL: gl.constexpr, ROPE_KV: gl.constexpr,
                  HALF: gl.constexpr, PP: gl.constexpr, NB: gl.constexpr, W: gl.constexpr):
        """`triton_gemv_w4._chunk_epilogue` of row chunk pid_n: the same sums, roundings and stores."""
        dt: gl.constexpr = y_ptr.dtype.element_ty
        L1: gl.constexpr = gl.BlockedLayout([1], [32], [W], [0])
        if ROPE_KV:
            D: gl.constexpr = 2 * HALF
            p = gl.arange(0, PP, layout=L1)
            for hh in gl.static_range(NB // D):
                head = pid_n * (NB // D) + hh
                for j0 in gl.static_range(0, HALF, PP):
                    d = j0 + p
                    ra = head * D + d  # x[j] and its rope partner x[j + D/2]
                    a = _rnd(_slice_sum(ws_ptr, N, ra, ra < N, NSPLIT, L1), dt).to(dt)
                    b = _rnd(_slice_sum(ws_ptr, N, ra + HALF, ra + HALF < N, NSPLIT, L1), dt).to(dt)
                    _rope_kv_store(a, b, d, gl.full([PP], 0, gl.int32, L1) + head, head, cos_ptr, sin_ptr, y_ptr,
                                   kp_ptr, vp_ptr, slot_ptr, s_kslot, s_kh, s_vslot, s_vh, n_q, n_qk, HALF)
        else:
            EP: gl.constexpr = NB & -NB
            for piece in gl.static_range(NB // EP):
                rr = pid_n * NB + piece * EP + gl.arange(0, EP, layout=L1)
                ok = rr < N
                _rows_store(_slice_sum(ws_ptr, N, rr, ok, NSPLIT, L1), rr, ok, r_ptr, y_ptr, RESIDUAL, dt)

    @gluon.jit
    def _g4m_kernel(w_ptr, sz_ptr, op_ptr, r_ptr, y_ptr, ws_ptr, cnt_ptr, N, NT,
                    cos_ptr, sin_ptr, kp_ptr, vp_ptr, slot_ptr, s_kslot, s_kh, s_vslot, s_vh, n_q, n_qk,
                    NB: gl.constexpr, W: gl.constexpr, S: gl.constexpr, WC: gl.constexpr, PDL: gl.constexpr,
                    RESIDUAL: gl.constexpr, ROPE_KV: gl.constexpr, HALF: gl.constexpr, PP: gl.constexpr,
                    NSPLIT: gl.constexpr):
        pid_k = gl.program_id(0)  # K-major: a row chunk's K slices launch together
        pid_n = gl.program_id(1)
        T: gl.constexpr = 32 * W
        TILES: gl.constexpr = NB // 16 // W
        L2D: gl.constexpr = gl.BlockedLayout([1, 4], [32, 1], [W, 1], [1, 0])  # thread i: row i, 4 words
        L1D: gl.constexpr = gl.SliceLayout(1, L2D)
        LJ: gl.constexpr = gl.SliceLayout(0, L2D)
        i = gl.arange(0, T, layout=L1D)
        lane = i % 32
        warp = i // 32
        g = lane // 4
        t = lane % 4
        jj = gl.arange(0, 4, layout=LJ)
        rt = pid_n * (NB // 16) + warp
        tile = (pid_k * NT + rt).to(gl.int64)
        w_ptrs = w_ptr + tile[:, None] * 512 + (lane * 4)[:, None] + jj[None, :]
        s_ptrs = sz_ptr + tile[:, None] * 128 + (lane * 4)[:, None] + jj[None, :]
        W_STEP: gl.constexpr = W * 512
        S_STEP: gl.constexpr = W * 128
        SL: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
        wbuf = gl.allocate_shared_memory(gl.int32, [S * 4, T, 4], SL)
        sbuf = gl.allocate_shared_memory(gl.int32, [S, T, 4], SL)
        # the first S - 1 tiles in flight before anything else (under PDL: before the wait)
        for j in gl.static_range(S - 1):
            if j < TILES:
                _issue(wbuf, sbuf, w_ptrs + j * W_STEP, s_ptrs + j * S_STEP, j, WC)
            ac.commit_group()
        if PDL:  # the operands, the workspace and the counters belong to the previous kernels until here
            gdc_wait()
            gdc_launch_dependents()
        ob = op_ptr + pid_k * (11 * 128) + (lane * 4)[:, None] + jj[None, :]
        b_a0 = gl.load(ob)
        b_b0 = gl.load(ob + 128)
        b_a1 = gl.load(ob + 256)
        b_b1 = gl.load(ob + 384)
        b_a2 = gl.load(ob + 512)
        b_b2 = gl.load(ob + 640)
        b_a3 = gl.load(ob + 768)
        b_b3 = gl.load(ob + 896)
        c_init = gl.load(ob + 1024).to(gl.float32, bitcast=True)
        xz = gl.load(ob + 1152).to(gl.float32, bitcast=True)
        unscale = gl.load(ob + 1280).to(gl.float32, bitcast=True)
        # lane t == 0 of each g stores its rows g (entry 0) and g + 8 (entry 2) at PAIRED positions 2g, 2g + 1
        keep = ((t == 0)[:, None]) & ((jj == 0) | (jj == 2))[None, :]
        out = ws_ptr + pid_k * N + rt[:, None] * 16 + 2 * g[:, None] + (jj // 2)[None, :]
        for it in range(TILES):
            nxt = it + S - 1
            if nxt < TILES:
                _issue(wbuf, sbuf, w_ptrs + nxt * W_STEP, s_ptrs + nxt * S_STEP, nxt % S, WC)
            ac.commit_group()
            ac.wait_group(S - 1)  # this thread's copies of tile `it` have landed (its own: no barrier)
            st = it % S
            d = _mma4(wbuf.index(st * 4).load(L2D), b_a0, b_b0, c_init)
            d = _mma4(wbuf.index(st * 4 + 1).load(L2D), b_a1, b_b1, d)
            d = _mma4(wbuf.index(st * 4 + 2).load(L2D), b_a2, b_b2, d)
            d = _mma4(wbuf.index(st * 4 + 3).load(L2D), b_a3, b_b3, d)
            sc = sbuf.index(st).load(L2D)
            s = (sc << 16).to(gl.float32, bitcast=True)  # bf16 scale in the low half, zero in the high
            z = (sc & -65536).to(gl.float32, bitcast=True)
            r = gl.inline_asm_elementwise(_ROW_SUMS_ASM, "=f,=f,=f,=f,f,f,f,f", [d * s + z * xz], dtype=gl.float32,
                                          is_pure=True, pack=4)
            gl.store(out + it * (16 * W), r * unscale, mask=keep)
        # `triton_gemv_w4._finish`: every thread's partials stored, then the chunk's count; its last program adds
        _barrier()
        prev = gl.atomic_add(cnt_ptr + pid_n, 1, sem="acq_rel", scope="gpu")
        if prev + 1 == NSPLIT:
            _epilogue(ws_ptr, r_ptr, y_ptr, N, pid_n, cos_ptr, sin_ptr, kp_ptr, vp_ptr, slot_ptr, s_kslot, s_kh,
                      s_vslot, s_vh, n_q, n_qk, NSPLIT, RESIDUAL, ROPE_KV, HALF, PP, NB, W)
            gl.atomic_xchg(cnt_ptr + pid_n, 0)  # ready for the next call (or graph replay)


def fits(n: int, k: int, cfg: M.W4MmaConfig, rope_kv: bool, half: int) -> bool:
    """Whether this Triton has Gluon and the launch is one the Gluon kernel takes: whole row chunks (its loop
    loads without masks), whole warps' tiles, a power-of-two stage count."""
    if not AVAILABLE or cfg.gluon not in STAGES or cfg.weight_cache not in (0, 2) or cfg.persistent:
        return False
    _, nb = row_chunks(n, cfg, rope_kv, half, pow2=False)
    return n % nb == 0 and nb % (MMA_ROWS * cfg.num_warps) == 0 and k % MMA_COLS == 0


def launch(x: torch.Tensor, g: torch.Tensor, w: torch.Tensor, sz: torch.Tensor, r: torch.Tensor, y: torch.Tensor,
           n: int, k: int, eps: float, rope_args: tuple, *, pro: int, residual: bool, rope_kv: bool, half: int,
           cfg: M.W4MmaConfig, pdl: bool, merge: tuple[int, int] = (1, 1)) -> None:
    """`triton_gemv_w4m.launch`'s product (same arguments) as `_prep_kernel` then `_g4m_kernel` (CUDA; `fits`)."""
    _, nb = row_chunks(n, cfg, rope_kv, half, pow2=False)
    op = prep(x, g, y, k, eps, pro=pro, pdl=pdl, merge=merge)
    grid = (k // MMA_COLS, n // nb)
    ws, cnt = _workspace(x.device, grid[0] * n, grid[1])
    _g4m_kernel[grid](w, sz, op, r, y, ws, cnt, n, n // MMA_ROWS, *rope_args, NB=nb, W=cfg.num_warps, S=cfg.gluon,
                      WC=cfg.weight_cache, PDL=pdl, RESIDUAL=residual, ROPE_KV=rope_kv, HALF=half,
                      PP=min(64, half & -half), NSPLIT=grid[0], num_warps=cfg.num_warps,
                      **({"launch_pdl": True} if pdl else {}))
