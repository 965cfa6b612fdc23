"""A probe, not engine code: the tensor-core int4 GEMV's inner loop (`augury.layers.triton_gemv_w4m`) with its
weight tiles staged through shared memory by cp.async, written in Gluon so that nothing but the thread's own
`cp.async.wait_group` stands between a tile's copy and its use.

Why: the Triton kernel keeps its tiles in flight in registers (2 a warp: 128 registers, 4 programs a
multiprocessor), and Triton's own software pipeliner (`W4MmaConfig.stages`, fortieth session) put a whole-program
barrier in every loop step and was slower. Here each thread copies its own 16-byte pieces of a tile and later reads
back exactly those bytes, so no other thread's copies matter and no barrier is needed; the bytes in flight are
bounded by shared memory (S stages x 2.5 KB a warp), not by registers.

Same bytes as the engine's mma layout (`int4_layout.pack_mma` / `scales_mma`), same per-tile math (the same inline
PTX). The per-slice mma operands (B fragments, accumulator start, zero term, unscale) come precomputed from a
small Triton kernel that calls the engine's own `_operands` (`prep_operands`), so the product kernel's prologue is
only their loads: this measures the streaming loop's ceiling, not the norm / SiLU prologues. Output: each K
slice's partial row sums, in the workspace's PAIRED order ([K / 256, N] fp32), not yet added over slices.
Since the forty-fourth session the prep kernel, `_issue` and `_mma4` are the engine's (`gluon_gemv_w4m`, which grew
from this probe); the loop below stays the probe's own (no finish).
"""
from __future__ import annotations

import torch
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy as ac

from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from augury.layers import gluon_gemv_w4m as E, triton_gemv_w4m as M
from augury.layers.gluon_gemv_w4m import _issue, _mma4

_ROW_SUMS = M._ROW_SUMS
N_OPS = tl.constexpr(E.N_OPS)  # b_a0, b_b0, ..., b_b3, c_init, xz, unscale (each [32 lanes, 4] words)


def prep_operands(x: torch.Tensor) -> torch.Tensor:
    """x [1, K] bf16 -> [K / 256, N_OPS, 32, 4] int32: the engine's prep kernel for a plain x (PRO 0), since the
    forty-fourth session `augury.layers.gluon_gemv_w4m.prep` (this probe's own kernel, moved there)."""
    return E.prep(x, x, x, x.shape[-1], 0.0, pro=0, pdl=False)


@gluon.jit
def _g4m_kernel(w_ptr, sz_ptr, op_ptr, ws_ptr, N, NT, NB: gl.constexpr, W: gl.constexpr, S: gl.constexpr,
                WC: gl.constexpr, PDL: gl.constexpr = False):
    pid_k = gl.program_id(0)  # K-major, as the engine's layer products launch
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
    wbuf = gl.allocate_shared_memory(gl.int32, [S * 4, T, 4], SL)  # Gluon's shapes are powers of two, so S is too
    sbuf = gl.allocate_shared_memory(gl.int32, [S, T, 4], SL)
    # the first S - 1 tiles in flight before anything else (under PDL: before the wait)
    for j in gl.static_range(S - 1):
        if j < TILES:
            _issue(wbuf, sbuf, w_ptrs + j * W_STEP, s_ptrs + j * S_STEP, j, WC)
        ac.commit_group()
    if PDL:  # as the engine's products: the weights need nothing of the previous kernel, the operands do
        gdc_wait()
        gdc_launch_dependents()
    ob = op_ptr + pid_k * (N_OPS * 128) + (lane * 4)[:, None] + jj[None, :]
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
        p0 = wbuf.index(st * 4).load(L2D)
        p1 = wbuf.index(st * 4 + 1).load(L2D)
        p2 = wbuf.index(st * 4 + 2).load(L2D)
        p3 = wbuf.index(st * 4 + 3).load(L2D)
        sc = sbuf.index(st).load(L2D)
        d = _mma4(p0, b_a0, b_b0, c_init)
        d = _mma4(p1, b_a1, b_b1, d)
        d = _mma4(p2, b_a2, b_b2, d)
        d = _mma4(p3, b_a3, b_b3, d)
        s = (sc << 16).to(gl.float32, bitcast=True)
        z = (sc & -65536).to(gl.float32, bitcast=True)
        r = gl.inline_asm_elementwise(_ROW_SUMS, "=f,=f,=f,=f,f,f,f,f", [d * s + z * xz], dtype=gl.float32,
                                      is_pure=True, pack=4)
        gl.store(out + it * (16 * W), r * unscale, mask=keep)


def launch(w: torch.Tensor, sz: torch.Tensor, op: torch.Tensor, ws: torch.Tensor, n: int, k: int,
           nb: int, warps: int, stages: int, wc: int = 2, pdl: bool = False) -> None:
    """Partial sums of every K slice into ws [K / 256, N] (fp32) for the packed weight (w, sz)."""
    assert n % nb == 0 and nb % (16 * warps) == 0 and stages in (2, 4, 8)
    _g4m_kernel[(k // 256, n // nb)](w, sz, op, ws, n, n // 16, NB=nb, W=warps, S=stages, WC=wc, PDL=pdl,
                                             num_warps=warps, **({"launch_pdl": True} if pdl else {}))


def unpair(ws: torch.Tensor, n: int) -> torch.Tensor:
    """The workspace's PAIRED row order (a tile's rows 0, 8, 1, 9, ...) -> rows in order, summed over slices."""
    tot = ws.sum(0).view(n // 16, 8, 2)
    return tot.transpose(1, 2).reshape(n)
