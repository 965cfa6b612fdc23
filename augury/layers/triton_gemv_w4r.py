"""One-row int4 products for decode on a row-major int4 layout, split over K, in Triton.

`triton_gemv_w4` reads tinygemm's bytes in place: there the words a thread holds belong to four
different 32-column groups, so every word pays for its own (scale, zero) (decode, two FMAs, an
add), and the layout's lane arithmetic costs address work per tile (offline sm_90 SASS, Triton
3.6: 3.77 loop instructions per weight on gate_up). This kernel reads the GEMV's own layout
(`int4_layout.pack_rows`): int32 [N, K / 8], row-major, word j of a row holding columns
8j..8j+7 with the nibbles in the order [0, 2, 4, 6, 1, 3, 5, 7], so that
- a thread's 16-byte load (4 words) is 32 consecutive columns: one group of 32, one (scale, zero)
  for 32 weights (`Int4Linear.gemv_scales`, int32 [N, G], bf16 scale low, zero high);
- the nibble pairs `_HALF2_DOT` decodes into one fp16x2 register ((0, 4), (1, 5), (2, 6), (3, 7))
  are adjacent columns, so its input operands are x's consecutive fp16 pairs.

A program owns a K slice of E entries of 32 columns (E * 32 columns) and a chunk of NB rows; it
applies the prologue to its slice of x once, keeps the fp16 pairs in registers, and streams row
tiles [BN * E, 4] (a thread: one entry, i.e. one 16-byte load per row), viewed as [BN, E, 4]. The
partial sums per slice and the chunk's last program adding them in slice order (deterministic)
are `triton_gemv_w4`'s (`_finish`; one slice over all of K writes its rows' outputs itself), as are
the products' numerics (the same per-word fp16x2 dot,
the same power-of-two range scaling of the slice's inputs), so both kernels give the same values
up to the order of the fp32 sums. On 8B-sized shapes the weight is tile-major (`int4_layout.block_rows`:
16-row x slice tiles contiguous), chunks are whole (no masks) and the last row tile is peeled off the
prefetching loop. Per product on the H200 5-17% faster than `triton_gemv_w4`; the whole decode step
followed only once the layer products launch their successors late (`W4RowsConfig.late_launch`: early, the
next grid's programs piled onto the multiprocessors a small grid left free), docs/benchmarks.md, twentieth
and twenty-first sessions. Since the twenty-second the tensor-core GEMV (`triton_gemv_w4m`) is
`Int4Linear`'s default under AUGURY_INT4_GEMV=1; this one serves shapes its tiles do not fit and
AUGURY_INT4_GEMV_LAYOUT=rows. Written so it also runs under TRITON_INTERPRET=1 (tests).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl

from augury.layers import launch_env
from augury.layers.triton_gemv import _norm_inv, _rnd, _x_in
from augury.layers.int4_layout import BLOCK_ROWS, block_rows
from augury.layers.triton_gemv_w4 import (_chunk_epilogue, _finish, _h2, _half2_dot, _pow2_range, _workspace,
                                          product_class, row_chunks)


@dataclass(frozen=True)
class W4RowsConfig:
    block_n: int = 64  # rows per loop step
    entries: int = 8  # E: 32-column entries per K slice (a slice is 32 E columns); fixed by a blocked weight
    rows_per_program: int = 512  # NB: a power of two, a multiple of block_n
    num_warps: int = 4
    stages: int = 1  # > 1: row tiles pipelined through shared memory (Triton's cp.async pipeline)
    late_launch: bool = False  # under PDL, the next kernel launches after this program's row tiles, not at its wait


_STAGES = int(os.environ.get("AUGURY_W4R_STAGES", "0"))  # > 0: every shape's default pipelined that deep (A/B runs)


# each Llama-3-8B product's best on the H200 (docs/benchmarks.md, twentieth session; the probe over
# configs: docs/data/gpu20/w4r_probe.py), then in the layer chain (twenty-first session): every layer
# product launches its successor late (let early, the next grid's programs piled onto the multiprocessors
# this one left free and the chain ran 100.1 us a layer instead of 83.1), and down takes 256-row chunks
# without the shared-memory pipeline (224 programs instead of 112 over fewer than the machine's 132
# multiprocessors: 77.8 us)
_DEFAULTS = {
    "lm_head": W4RowsConfig(block_n=64, entries=8, rows_per_program=256, num_warps=4),
    "gate_up": W4RowsConfig(block_n=64, entries=8, rows_per_program=1024, num_warps=4, late_launch=True),
    "down": W4RowsConfig(block_n=32, entries=32, rows_per_program=256, num_warps=4, late_launch=True),
    "o_proj": W4RowsConfig(block_n=128, entries=8, rows_per_program=256, num_warps=8, late_launch=True),
    "qkv": W4RowsConfig(block_n=64, entries=8, rows_per_program=512, num_warps=4, stages=3, late_launch=True),
}
_ENV_CFG = launch_env.overrides("AUGURY_W4R_CFG", W4RowsConfig)  # A/B runs: `launch_env`


def default_config(n: int, k: int) -> W4RowsConfig:
    """Launch parameters from the weight's shape alone (a captured step always launches the same grid
    and a blocked weight is laid out for them): `_DEFAULTS` by `product_class`, every stage count
    overridden by AUGURY_W4R_STAGES where set, then AUGURY_W4R_CFG's fields for that product."""
    cls = product_class(n, k)
    cfg = _DEFAULTS[cls]
    cfg = replace(cfg, stages=_STAGES) if _STAGES > 0 else cfg
    return launch_env.apply(cfg, cls, _ENV_CFG)


def blocked_entries(n: int, k: int, group_size: int) -> int | None:
    """The entries per K slice a weight of this shape is blocked for (`int4_layout.block_rows`, at
    the default config's slice width), or None where it stays row-major: groups other than 32,
    rows not whole 16-row blocks, K not whole slices, or K covered by one slice."""
    e = default_config(n, k).entries
    if group_size != 32 or n % BLOCK_ROWS or k % (32 * e) or k <= 32 * e:
        return None
    return e


def pack(q: torch.Tensor, scales_t: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """q [N, K] (0..15) and the (scale, zero) pairs as int32 [N, G] (`int4_layout.transpose_scales`) ->
    the GEMV's weight and scales: row-major (`int4_layout.pack_rows`), tile-major where
    `blocked_entries` says so. `launch` reads them back by the same rule."""
    from augury.layers.int4_layout import pack_rows

    n, k = q.shape
    w = pack_rows(q)
    e = blocked_entries(n, k, group_size)
    return block_rows(w, scales_t, e) if e else (w, scales_t.contiguous())


@triton.jit
def _x_pair(x_ptr, g_ptr, col, ok, K, inv, PRO: tl.constexpr, dt: tl.constexpr):
    """The prologue's inputs at columns col and col + 1 (fp32): one fp16 pair of `_HALF2_DOT`."""
    return _x_in(x_ptr, g_ptr, col, ok, K, inv, PRO, dt), _x_in(x_ptr, g_ptr, col + 1, ok, K, inv, PRO, dt)


@triton.jit
def _tile_part(p, sz, x0, x1, x2, x3, a0, a1, a2, a3, b0, b1, b2, b3, xs, unscale, BN: tl.constexpr, E: tl.constexpr,
               F16: tl.constexpr):
    """One row tile's partial sums over the slice: p [BN * E, 4] words, sz [BN * E] (scale, zero) pairs."""
    p3 = tl.reshape(p, [BN, E, 4])
    t = tl.sum(_half2_dot(p3, x0, x1, x2, x3, a0[None], a1[None], a2[None], a3[None],
                          b0[None], b1[None], b2[None], b3[None], F16 == 1), axis=2)
    sz2 = tl.reshape(sz, [BN, E])
    s = (sz2 << 16).to(tl.float32, bitcast=True)  # bf16 scale in the low half, zero in the high
    z = (sz2 & -65536).to(tl.float32, bitcast=True)
    return tl.sum(t * s + z * xs[None, :], axis=1) * unscale


@triton.jit
def _put(part, out, N, ws_row, r_ptr, y_ptr, DIRECT: tl.constexpr, RESIDUAL: tl.constexpr, dt: tl.constexpr):
    """A row tile's sums: into the workspace (several K slices, or rope), or, with one slice covering
    K, the output itself (+ the residual)."""
    ok = out < N
    if DIRECT:
        y = _rnd(part, dt).to(dt)
        if RESIDUAL:
            y = _rnd(y.to(tl.float32) + tl.load(r_ptr + out, mask=ok, other=0.0).to(tl.float32), dt).to(dt)
        tl.store(y_ptr + out, y, mask=ok)
    else:
        tl.store(ws_row + out, part, mask=ok)


@triton.jit(do_not_specialize=["s_one"])
def _w4_rows_kernel(
    x_ptr, g_ptr, w_ptr, sz_ptr, r_ptr, y_ptr, ws_ptr, cnt_ptr,
    N, K, KW, G, s_one, eps, norm_k,
    cos_ptr, sin_ptr, kp_ptr, vp_ptr, slot_ptr, s_kslot, s_kh, s_vslot, s_vh, n_q, n_qk,
    PRO: tl.constexpr, RESIDUAL: tl.constexpr, ROPE_KV: tl.constexpr, HALF: tl.constexpr, PP: tl.constexpr,
    GS: tl.constexpr, NB: tl.constexpr, BN: tl.constexpr, E: tl.constexpr,
    PDL: tl.constexpr, F16: tl.constexpr, NSPLIT: tl.constexpr, NORM_BLOCK: tl.constexpr, EVEN: tl.constexpr,
    BLOCKED: tl.constexpr = False, STAGES: tl.constexpr = 1, DIRECT: tl.constexpr = False,
    RB: tl.constexpr = 16, LATE_LAUNCH: tl.constexpr = False,
):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    dt = y_ptr.dtype.element_ty
    # tile entries: e = row * E + entry; a thread keeps one entry (its slice of x) over all its rows
    e = tl.arange(0, BN * E)
    ent = e % E
    row_e = e // E
    wd = tl.arange(0, 4)
    c0 = pid_k * (32 * E)  # the slice's first column
    row0 = pid_n * NB
    ok_k = c0 + 32 * ent < K  # the last slice may be partial
    grp = (c0 + 32 * ent) // GS
    # s_one is 1 at run time (not specialized): it hides the scales' contiguity along the entries from
    # Triton, so their load takes the weight tile's distribution (one word per thread per row) and needs
    # no layout conversion
    if BLOCKED:  # `int4_layout.block_rows`: (RB-row block, slice) tiles of RB * E entries, contiguous
        tile = ((row0 + row_e) // RB * NSPLIT + pid_k).to(tl.int64) * (RB * E) + (row_e % RB) * E + ent
        w_ptrs = w_ptr + tile[:, None] * 4 + wd[None, :]
        s_ptrs = sz_ptr + tile * s_one
        w_step = (BN // RB) * NSPLIT * RB * E * 4
        s_step = (BN // RB) * NSPLIT * RB * E
    else:
        w_ptrs = w_ptr + (row0 + row_e).to(tl.int64)[:, None] * KW + (c0 // 8 + 4 * ent)[:, None] + wd[None, :]
        s_ptrs = sz_ptr + (row0 + row_e).to(tl.int64) * G + grp * s_one
        w_step = BN * KW
        s_step = BN * G
    okr = (row0 + row_e < N) & ok_k
    p, sz = 0, 0
    if STAGES == 1:
        if EVEN:  # the first row tile: in flight before gdc_wait
            p = tl.load(w_ptrs)
            sz = tl.load(s_ptrs)
        else:
            p = tl.load(w_ptrs, mask=okr[:, None], other=0)
            sz = tl.load(s_ptrs, mask=okr, other=0)
    if PDL:
        tl.extra.cuda.gdc_wait()  # x, r, the workspace and the counters belong to the previous kernel until here
        if not LATE_LAUNCH:
            tl.extra.cuda.gdc_launch_dependents()
    # the slice's inputs, once, as [E, 4] per pair position j: word i of entry e holds columns
    # c0 + 32 e + 8 i + (2 j, 2 j + 1) in its pair j
    je = tl.arange(0, E)
    colw = (c0 + 32 * je)[:, None] + 8 * wd[None, :]
    okx = (c0 + 32 * je < K)[:, None]
    inv = 1.0
    if PRO == 1:
        inv = _norm_inv(x_ptr, K, norm_k, eps, NORM_BLOCK)
    a0, b0 = _x_pair(x_ptr, g_ptr, colw, okx, K, inv, PRO, dt)
    a1, b1 = _x_pair(x_ptr, g_ptr, colw + 2, okx, K, inv, PRO, dt)
    a2, b2 = _x_pair(x_ptr, g_ptr, colw + 4, okx, K, inv, PRO, dt)
    a3, b3 = _x_pair(x_ptr, g_ptr, colw + 6, okx, K, inv, PRO, dt)
    up, unscale = _pow2_range(a0, b0, a1, b1, a2, b2, a3, b3)
    a0, b0, a1, b1, a2, b2, a3, b3 = a0 * up, b0 * up, a1 * up, b1 * up, a2 * up, b2 * up, a3 * up, b3 * up
    # the sum of each entry's 32 inputs (the zero term), [E]
    xs = tl.sum((a0 + b0) + (a1 + b1) + (a2 + b2) + (a3 + b3), axis=1)
    x0, x1, x2, x3 = 0, 0, 0, 0  # the PTX's fp16 pairs (F16 == 1 only)
    if F16 == 1:
        x0, x1, x2, x3 = _h2(a0, b0), _h2(a1, b1), _h2(a2, b2), _h2(a3, b3)
    i = tl.arange(0, BN)
    if STAGES > 1:  # STAGES - 1 row tiles in flight through shared memory (Triton's cp.async pipeline)
        for rt in tl.range(0, NB, BN, num_stages=STAGES):
            if EVEN:
                pt = tl.load(w_ptrs + (rt // BN) * w_step)
                szt = tl.load(s_ptrs + (rt // BN) * s_step)
            else:
                okt = okr & (row0 + rt + row_e < N)
                pt = tl.load(w_ptrs + (rt // BN) * w_step, mask=okt[:, None], other=0)
                szt = tl.load(s_ptrs + (rt // BN) * s_step, mask=okt, other=0)
            part = _tile_part(pt, szt, x0, x1, x2, x3, a0, a1, a2, a3, b0, b1, b2, b3, xs, unscale, BN, E, F16)
            _put(part, row0 + rt + i, N, ws_ptr + pid_k * N, r_ptr, y_ptr, DIRECT, RESIDUAL, dt)
    else:
        # the next row tile is in flight while this one is used; the chunk's last tile is peeled off, so
        # whole chunks (EVEN) load without masks and never read past the chunk
        for rt in range(0, NB - BN, BN):
            w_ptrs += w_step
            s_ptrs += s_step
            if EVEN:
                p_next = tl.load(w_ptrs)
                sz_next = tl.load(s_ptrs)
            else:
                nxt = okr & (row0 + rt + BN + row_e < N)
                p_next = tl.load(w_ptrs, mask=nxt[:, None], other=0)
                sz_next = tl.load(s_ptrs, mask=nxt, other=0)
            part = _tile_part(p, sz, x0, x1, x2, x3, a0, a1, a2, a3, b0, b1, b2, b3, xs, unscale, BN, E, F16)
            _put(part, row0 + rt + i, N, ws_ptr + pid_k * N, r_ptr, y_ptr, DIRECT, RESIDUAL, dt)
            p = p_next
            sz = sz_next
        part = _tile_part(p, sz, x0, x1, x2, x3, a0, a1, a2, a3, b0, b1, b2, b3, xs, unscale, BN, E, F16)
        _put(part, row0 + NB - BN + i, N, ws_ptr + pid_k * N, r_ptr, y_ptr, DIRECT, RESIDUAL, dt)

    if PDL and LATE_LAUNCH:
        tl.extra.cuda.gdc_launch_dependents()
    if NSPLIT > 1:
        _finish(ws_ptr, cnt_ptr, r_ptr, y_ptr, N, pid_n, NSPLIT, row0, cos_ptr, sin_ptr, kp_ptr, vp_ptr, slot_ptr,
                s_kslot, s_kh, s_vslot, s_vh, n_q, n_qk, RESIDUAL, ROPE_KV, HALF, PP, NB, dt)
    elif not DIRECT:  # one slice, rope: the chunk's rows are all in the workspace, this program's own
        tl.debug_barrier()
        _chunk_epilogue(ws_ptr, r_ptr, y_ptr, N, pid_n, 1, row0, cos_ptr, sin_ptr, kp_ptr, vp_ptr, slot_ptr,
                        s_kslot, s_kh, s_vslot, s_vh, n_q, n_qk, RESIDUAL, ROPE_KV, HALF, PP, NB, dt)


def pack_from_tinygemm(packed: torch.Tensor, scales_t: torch.Tensor, group_size: int,
                       chunk_rows: int = 4096) -> tuple[torch.Tensor, torch.Tensor]:
    """`pack` of a weight held in tinygemm's layout (`Int4Linear.packed` on CUDA), on its device, a few
    thousand rows at a time (the unpacked nibbles of an 8B LM head at once would take GBs)."""
    from augury.layers.int4_layout import pack_rows, unpack

    n = 8 * packed.shape[0]
    k = 16 * (2 * packed.shape[3]) * packed.shape[1]
    e = blocked_entries(n, k, group_size)
    w = torch.empty((n, k // 8), dtype=torch.int32, device=packed.device)
    sz = torch.empty_like(scales_t)
    step = max(BLOCK_ROWS, chunk_rows // BLOCK_ROWS * BLOCK_ROWS)
    for r0 in range(0, n, step):
        r1 = min(n, r0 + step)
        wc = pack_rows(unpack(packed[r0 // 8: r1 // 8]))
        sc = scales_t[r0:r1]
        if e:
            wc, sc = block_rows(wc, sc.contiguous(), e)
        w[r0:r1], sz[r0:r1] = wc, sc
    return w, sz


def launch(x: torch.Tensor, g: torch.Tensor, w: torch.Tensor, sz: torch.Tensor, r: torch.Tensor, y: torch.Tensor,
           n: int, k: int, eps: float, rope_args: tuple, *, pro: int, residual: bool, rope_kv: bool, half: int,
           group_size: int, cfg: W4RowsConfig | None, pdl: bool) -> None:
    """`_w4_rows_kernel` over (row chunks, K slices); arguments as `triton_gemv._launch` prepares them,
    w and sz as `pack` leaves them."""
    cfg = cfg or default_config(n, k)
    bn, ne = cfg.block_n, cfg.entries
    blocked = blocked_entries(n, k, group_size)
    if blocked is not None and (ne != blocked or bn % BLOCK_ROWS):
        raise ValueError(f"gemv: this {n}x{k} int4 weight is blocked for {blocked} entries per slice and "
                         f"{BLOCK_ROWS}-row tiles (`triton_gemv_w4r.pack`); config {cfg} does not fit it")
    if bn < 1 or ne < 1 or bn & (bn - 1) or ne & (ne - 1):
        raise ValueError(f"gemv: int4 block_n and entries must be powers of two, got {cfg}")
    bn, nb = row_chunks(n, cfg, rope_kv, half)
    if rope_kv and blocked is not None and bn % BLOCK_ROWS:
        raise ValueError(f"gemv: heads of {2 * half} rows do not fit the blocked layout's {BLOCK_ROWS}-row tiles")
    grid = (triton.cdiv(n, nb), triton.cdiv(k, 32 * ne))
    ws, cnt = _workspace(x.device, grid[1] * n, grid[0])
    compiled = x.device.type == "cuda" and os.environ.get("TRITON_INTERPRET") != "1"
    f16 = 1 if compiled else 2
    _w4_rows_kernel[grid](
        x, g, w, sz, r, y, ws, cnt, n, k, k // 8, k // group_size, 1, eps, float(k), *rope_args,
        PRO=pro, RESIDUAL=residual, ROPE_KV=rope_kv, HALF=half, PP=min(64, half & -half), GS=group_size,
        NB=nb, BN=bn, E=ne, PDL=pdl, F16=f16, NSPLIT=grid[1], NORM_BLOCK=min(triton.next_power_of_2(k), 4096),
        EVEN=n % nb == 0 and k % (32 * ne) == 0, BLOCKED=blocked is not None, STAGES=cfg.stages, RB=BLOCK_ROWS,
        LATE_LAUNCH=cfg.late_launch,
        DIRECT=grid[1] == 1 and not rope_kv,  # one slice covers K: the output straight from the row tiles
        num_warps=cfg.num_warps, num_stages=1, **({"launch_pdl": True} if pdl else {}),
    )
