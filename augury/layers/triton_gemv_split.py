"""A split-K one-row GEMV for plain (bf16/fp16/fp32) weights whose input is attention's split partials.

`triton_gemv.gemv` keeps each program on whole rows of W, so every program reads all of x: 8 KB from L2 for
an 8B o_proj, fine for a finished attention output. When attention leaves its splits unmerged
(`triton_paged_decode.paged_decode_partials`, a B = 1 decode step) x is S float32 partials instead, and 512
programs each merging all of them would read ~80 MB of L2 for 33.5 MB of weight. Here each program owns a
256-column slice (two 128-wide heads) and a chunk of rows, merges only its slice's partials once
(`triton_gemv._x_merge`), and streams its chunk's rows against it; the slices' partial sums meet in the
int4 GEMVs' workspace, and the chunk's last program adds them in slice order with the residual epilogue
(`triton_gemv_w4._finish`): deterministic, as the other GEMVs. Launched K-major (a chunk's slices
together), as the tensor-core int4 GEMV (`triton_gemv_w4m`). Written so it also runs under
TRITON_INTERPRET=1 on the CPU (tests).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from augury.layers.triton_gemv import PRO_MERGE, PRO_NONE, _rnd, _x_in, _x_merge
from augury.layers.triton_gemv_w4 import _finish, _workspace


@dataclass(frozen=True)
class SplitConfig:
    rows_per_program: int = 128
    block_n: int = 16  # rows a loop step
    block_k: int = 256  # columns a program (its K slice)
    num_warps: int = 4


def supported(n: int, k: int, head_dim: int, cfg: SplitConfig | None = None) -> bool:
    """Whether this kernel takes an [n, k] weight whose input has heads of `head_dim` columns."""
    cfg = cfg or SplitConfig()
    return k % cfg.block_k == 0 and cfg.block_k % head_dim == 0 and cfg.rows_per_program % cfg.block_n == 0


@triton.jit
def _gemv_split_kernel(
    x_ptr, g_ptr, w_ptr, r_ptr, y_ptr, ws_ptr, cnt_ptr, N, K, s_wn,
    PRO: tl.constexpr, RESIDUAL: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, NB: tl.constexpr,
    NSPLIT: tl.constexpr, PDL: tl.constexpr, MS: tl.constexpr, MSP: tl.constexpr, MD: tl.constexpr,
):
    pid_k = tl.program_id(0)  # K-major: a chunk's slices launch together
    pid_n = tl.program_id(1)
    dt = y_ptr.dtype.element_ty
    row0 = pid_n * NB
    rows = row0 + tl.arange(0, BN)
    k = pid_k * BK + tl.arange(0, BK)
    w_ptrs = w_ptr + tl.minimum(rows, N - 1)[:, None].to(tl.int64) * s_wn + k[None, :]
    w = tl.load(w_ptrs)  # depends on no earlier kernel: in flight before the PDL wait
    if PDL:
        tl.extra.cuda.gdc_wait()  # x, the workspace and the counters belong to the previous kernel until here
        tl.extra.cuda.gdc_launch_dependents()
    if PRO == 3:
        xv = _rnd(_x_merge(x_ptr, g_ptr, pid_k * BK, K, BK, MS, MSP, MD), dt)  # rounded as attention stores it
    else:
        xv = _x_in(x_ptr, g_ptr, k, k < K, K, 1.0, PRO, dt)
    ws_row = ws_ptr + pid_k * N
    for it in range(NB // BN):
        # the next step's rows are loaded before this step's are used (past the chunk: masked off)
        nxt = rows + BN
        w_next = tl.load(w_ptrs + BN * s_wn, mask=((nxt < N) & (it + 1 < NB // BN))[:, None], other=0.0)
        tl.store(ws_row + rows, tl.sum(w.to(tl.float32) * xv[None, :], axis=1), mask=rows < N)
        w = w_next
        w_ptrs += BN * s_wn
        rows = nxt
    _finish(ws_ptr, cnt_ptr, r_ptr, y_ptr, N, pid_n, NSPLIT, row0, y_ptr, y_ptr, y_ptr, y_ptr, y_ptr,
            0, 0, 0, 0, 0, 0, RESIDUAL, False, 1, 1, NB, dt)


def gemv_split(x: torch.Tensor, w: torch.Tensor, y: torch.Tensor, *, residual: torch.Tensor | None,
               merge_ml: torch.Tensor | None, merge: dict, cfg: SplitConfig | None = None,
               pdl: bool = False) -> None:
    """y [1, N] = W [N, K] @ x (+ residual) with x either a plain [1, K] row or (merge_ml given) attention's
    float32 partials [S, K] (`triton_gemv.gemv`'s `merge_ml`; merge: its MS / MD constants)."""
    cfg = cfg or SplitConfig()
    N, K = w.shape
    if not supported(N, K, merge.get("MD", cfg.block_k), cfg):
        raise ValueError(f"gemv: the split-K GEMV takes K a multiple of {cfg.block_k} and heads dividing it, got "
                         f"[{N}, {K}], {merge} under {cfg}")
    grid = (K // cfg.block_k, triton.cdiv(N, cfg.rows_per_program))
    ws, cnt = _workspace(x.device, grid[0] * N, grid[1])
    ms = merge.get("MS", 1)
    _gemv_split_kernel[grid](
        x, merge_ml if merge_ml is not None else x, w, residual if residual is not None else y, y, ws, cnt,
        N, K, w.stride(0), PRO=PRO_MERGE if merge_ml is not None else PRO_NONE, RESIDUAL=residual is not None,
        BN=cfg.block_n, BK=cfg.block_k, NB=cfg.rows_per_program, NSPLIT=grid[0], PDL=pdl, MS=ms,
        MSP=triton.next_power_of_2(ms), MD=merge.get("MD", cfg.block_k),
        num_warps=cfg.num_warps, num_stages=1, **({"launch_pdl": True} if pdl else {}),
    )
