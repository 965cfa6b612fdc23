"""The tensor-core int4 GEMV (`triton_gemv_w4m`) as a persistent grid: every multiprocessor streams to the end.

The grid form launches a program per (row chunk, 256-column K slice). Its work per multiprocessor comes in whole
programs, so the machine is evenly loaded only when the program count is a multiple of the resident slots: the
8B down product (448 programs at four a multiprocessor on 132) leaves 80 multiprocessors three programs and 52
four, and under ncu its multiprocessors sit idle 39% of the kernel (twenty-fifth session).

Here the grid is the resident programs themselves (`W4MmaConfig.persistent` a multiprocessor), and the weight's
tiles, in their memory order (K slice, row tile), are cut into equal runs: program p takes steps
[p S / P, (p + 1) S / P) of the S = K / 256 x N / (16 W) steps of W tiles (warp w takes the step's tile w), so
the runs differ by one step at most, and each is one contiguous stretch of the weight. A warp keeps its next
`prefetch` tiles in flight the whole way, across K-slice boundaries, where it only rebuilds its B operands (the
inputs of the new slice: `_operands`). The partial sums go where the grid form puts them (the workspace row of
the tile's K slice), and the split-K finish is per row chunk of `rows_per_program` rows: a program adds the
number of the chunk's steps it stored to the chunk's counter, and whichever brings it to all of them
(K / 256 x the chunk's steps a slice) adds the slices and applies the epilogue (`_finish_count`).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from augury.layers.triton_gemv import _norm_inv, _x_apply, _x_load
from augury.layers.triton_gemv_w4 import _finish_count
from augury.layers.triton_gemv_w4m import _load_tile, _operands, _use_tile


@triton.jit
def _slice_operands(x_ptr, g_ptr, ks, grp, use, K, inv, dummy, is_a, is_b, t, PRO: tl.constexpr, dt: tl.constexpr,
                    W: tl.constexpr, ASM: tl.constexpr):
    """K slice ks's mma operands (`_operands`) from the inputs through the prologue (inv: the norm's 1 / rms)."""
    col0 = (ks * 256 + 32 * grp)[:, None] + tl.arange(0, 8)[None, :]
    a0, e0 = _x_load(x_ptr, g_ptr, col0, use, K, PRO)
    a1, e1 = _x_load(x_ptr, g_ptr, col0 + 8, use, K, PRO)
    a2, e2 = _x_load(x_ptr, g_ptr, col0 + 16, use, K, PRO)
    a3, e3 = _x_load(x_ptr, g_ptr, col0 + 24, use, K, PRO)
    return _operands(_x_apply(a0, e0, inv, PRO, dt), _x_apply(a1, e1, inv, PRO, dt), _x_apply(a2, e2, inv, PRO, dt),
                     _x_apply(a3, e3, inv, PRO, dt), dummy, is_a, is_b, t, W, ASM)


@triton.jit
def _w4_mma_stream_kernel(
    x_ptr, g_ptr, w_ptr, sz_ptr, r_ptr, y_ptr, ws_ptr, cnt_ptr,
    N, K, NT, eps, norm_k,
    cos_ptr, sin_ptr, kp_ptr, vp_ptr, slot_ptr, s_kslot, s_kh, s_vslot, s_vh, n_q, n_qk,
    PRO: tl.constexpr, RESIDUAL: tl.constexpr, ROPE_KV: tl.constexpr, HALF: tl.constexpr, PP: tl.constexpr,
    NB: tl.constexpr, W: tl.constexpr, PDL: tl.constexpr, ASM: tl.constexpr, NSPLIT: tl.constexpr,
    NORM_BLOCK: tl.constexpr, PIECES: tl.constexpr, PF: tl.constexpr = 1, LOADS_ONLY: tl.constexpr = False,
    WC: tl.constexpr = 0,
):
    pid = tl.program_id(0)
    npro = tl.num_programs(0)
    dt = y_ptr.dtype.element_ty
    T: tl.constexpr = 32 * W
    CS: tl.constexpr = NB // 16 // W  # steps of a row chunk in one K slice (the last chunk may have fewer)
    spk = NT // W  # steps of a K slice
    steps = NSPLIT * spk
    s0 = pid * steps // npro
    s1 = (pid + 1) * steps // npro
    i = tl.arange(0, T)
    lane = i % 32
    warp = i // 32
    g = lane // 4
    t = lane % 4
    jj = tl.arange(0, 4)
    zero_t = i * 0
    # step s, warp w: tile s W + w of the weight (K slice (s W) / NT, row tile (s W) % NT + w)
    tile = (s0 * W + warp).to(tl.int64)
    w_ptrs = w_ptr + tile[:, None] * 512 + (lane * 4)[:, None] + jj[None, :]
    s_ptrs = sz_ptr + tile[:, None] * 128 + (lane * 4)[:, None] + jj[None, :]
    W_STEP: tl.constexpr = W * 512
    S_STEP: tl.constexpr = W * 128
    # the run's first PF steps in flight before the PDL wait (the weight is no earlier kernel's); loads past
    # the run are masked off (they are the next program's)
    p0, p1, p2, p3, sc = _load_tile(w_ptrs, s_ptrs, zero_t + s0 < s1, False, WC)
    if PF >= 2:
        q0, q1, q2, q3, sq = _load_tile(w_ptrs + W_STEP, s_ptrs + S_STEP, zero_t + s0 + 1 < s1, False, WC)
    if PF >= 3:
        u0, u1, u2, u3, su = _load_tile(w_ptrs + 2 * W_STEP, s_ptrs + 2 * S_STEP, zero_t + s0 + 2 < s1, False, WC)
    if PF >= 4:
        h0, h1, h2, h3, sh = _load_tile(w_ptrs + 3 * W_STEP, s_ptrs + 3 * S_STEP, zero_t + s0 + 3 < s1, False, WC)
    w_ptrs += (PF - 1) * W_STEP
    s_ptrs += (PF - 1) * S_STEP
    if PDL:
        tl.extra.cuda.gdc_wait()  # x, r, the workspace and the counters belong to the previous kernel until here
        tl.extra.cuda.gdc_launch_dependents()
    is_a = (g == t)[:, None]
    is_b = (g == t + 4)[:, None]
    grp = tl.where(g == t, t, t + 4)
    use = is_a | is_b
    inv = 1.0
    if PRO == 1:
        inv = _norm_inv(x_ptr, K, norm_k, eps, NORM_BLOCK)
    # a tile's sums: lane t == 0 of each g stores rows g and g + 8 (the workspace's PAIRED order) at the tile's
    # 16 entries, which are tile x 16 from the workspace's start (K slice x N + row tile x 16)
    # (carried through the loop and stepped, as the grid form's: an offset rebuilt from the step each time
    # was moved into the store's layout through shared memory, 4 stores and 2 barriers a tile)
    out = (s0 * W + warp)[:, None] * 16 + 2 * g[:, None] + tl.arange(0, 2)[None, :]
    first = (t == 0)[:, None]
    junk = tl.zeros([T, 4], dtype=tl.int32)  # LOADS_ONLY: what keeps the loads alive
    # the operands of the run's first K slice; a step that opens another slice rebuilds them (one loop, not a
    # loop over slices around one over steps: the carried tile pointers kept their 16-byte load layout only so)
    b_a0, b_b0, b_a1, b_b1, b_a2, b_b2, b_a3, b_b3, c_init, xz, unscale = _slice_operands(
        x_ptr, g_ptr, s0 // spk, grp, use, K, inv, p0, is_a, is_b, t, PRO, dt, W, ASM)
    for st in range(s0, s1):
        if (st % spk == 0) & (st != s0):
            b_a0, b_b0, b_a1, b_b1, b_a2, b_b2, b_a3, b_b3, c_init, xz, unscale = _slice_operands(
                x_ptr, g_ptr, st // spk, grp, use, K, inv, p0, is_a, is_b, t, PRO, dt, W, ASM)
        w_ptrs += W_STEP
        s_ptrs += S_STEP
        n0, n1, n2, n3, scn = _load_tile(w_ptrs, s_ptrs, zero_t + st + PF < s1, False, WC)
        junk = _use_tile(p0, p1, p2, p3, sc, b_a0, b_b0, b_a1, b_b1, b_a2, b_b2, b_a3, b_b3, c_init, xz, unscale,
                         ws_ptr, out, first, junk, W, ASM, LOADS_ONLY)
        out += 16 * W
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
    if LOADS_ONLY:  # one word per program, so nothing above is dead code
        tl.store(ws_ptr + pid, tl.sum(tl.sum(junk, axis=1), axis=0).to(tl.float32, bitcast=True))
    # the split-K finish, one row chunk at a time along the run: the chunk's steps this program stored
    tl.debug_barrier()
    # (PIECES, the most any run has, unrolled: inside a loop the epilogue raised the kernel's registers 128 -> 168)
    s = s0
    for _ in tl.static_range(PIECES):
        if s < s1:
            r = s % spk  # the step within its K slice
            chunk = r // CS
            end = tl.minimum(s1, s - r + tl.minimum((chunk + 1) * CS, spk))
            _finish_count(ws_ptr, cnt_ptr, r_ptr, y_ptr, N, chunk, end - s, NSPLIT * tl.minimum(CS, spk - chunk * CS),
                          NSPLIT, chunk * NB, cos_ptr, sin_ptr, kp_ptr, vp_ptr, slot_ptr, s_kslot, s_kh, s_vslot, s_vh,
                          n_q, n_qk, RESIDUAL, ROPE_KV, HALF, PP, NB, dt, PAIRED=True)
            s = end


@functools.cache
def multiprocessors(device: torch.device) -> int:
    """The device's multiprocessor count (the persistent grid's unit); off CUDA (the interpreter) 3, a count
    that cuts the tests' small weights into runs that cross K-slice and chunk boundaries."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 3


def steps(n: int, k: int, num_warps: int) -> int:
    """Steps of W tiles in a weight (the units the runs are cut in)."""
    return (k // 256) * (n // 16 // num_warps)


@functools.cache
def pieces(n: int, k: int, num_warps: int, chunk_rows: int, programs: int) -> int:
    """The most (row chunk, K slice) pieces any program's run holds: the kernel's finish, unrolled that often."""
    spk, cs = n // 16 // num_warps, chunk_rows // 16 // num_warps
    total, most = steps(n, k, num_warps), 0
    for p in range(programs):
        s, s1, count = p * total // programs, (p + 1) * total // programs, 0
        while s < s1:
            r = s % spk
            s, count = min(s1, s - r + min((r // cs + 1) * cs, spk)), count + 1
        most = max(most, count)
    return most


def fits(n: int, num_warps: int, pro: int) -> bool:
    """Shapes the persistent form takes: every step's W tiles in one K slice (N / 16 a multiple of W). The
    attention-merge prologue (PRO 3) merges into a scratch row a program and K slice, which the grid form holds:
    it stays there."""
    return (n // 16) % num_warps == 0 and pro != 3
