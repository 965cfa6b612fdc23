"""One-row matrix-vector products for decode, with the layer's small ops folded in, in Triton.

A batch-1 decode step of a Llama-shaped model on a GPU is a weight stream: every
weight byte is read once per token and the arithmetic is negligible. Measured on the
H200 under `--compile` + CUDA graphs (docs/benchmarks.md, "Sixth session"), cuBLAS
streams the large projections at the bandwidth, but the small ones (qkv, o_proj) use
split-K GEMV kernels plus a reduction kernel and a copy each, at ~75% of it, and every
layer also launches an RMSNorm kernel before each projection, a SiLU-mul kernel and
residual adds: ~16 kernels per layer where the weights need 4.

`gemv` computes y = W x for one row with what surrounds the product inside the same
kernel:
- prologue `norm`: x is RMS-normalised and scaled by the norm's weight on load (each
  program recomputes the sum of squares of x, 8 KB read from L2, instead of a kernel
  and a round trip through memory);
- prologue `silu_mul`: x = [gate; up] from the fused gate/up projection, and the
  product reads silu(gate) * up;
- epilogue `residual`: y + r (the residual stream).
Rounding follows the unfused ops step by step (the normalised x is rounded to the
activation dtype before the weight multiplies it, SiLU's output before the product with
`up`, the projection's output before the residual add). The fused layer differs from the
unfused one in the order of the fp32 sums inside the product, and by a few fp32 ulps in
the norm's 1/sqrt and SiLU's exp (Triton's fast versions), which can move a rounding of
the normalised input by one bf16 step now and then.

Each program owns BLOCK_N output rows and walks K in BLOCK_K tiles, keeping a
[BLOCK_N, BLOCK_K] fp32 partial that is reduced once after the loop: no split-K, no
second kernel, no atomics, so the result is deterministic. Written so it also runs
under TRITON_INTERPRET=1 on the CPU (tests).
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

PRO_NONE, PRO_NORM, PRO_SILU_MUL = 0, 1, 2
_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


@dataclass(frozen=True)
class GemvConfig:
    block_n: int = 8
    block_k: int = 1024
    num_warps: int = 4
    num_stages: int = 1


def default_config(n: int, k: int) -> GemvConfig:
    """Launch parameters from (N, K) alone (a captured step always launches the same grid)."""
    return GemvConfig(block_n=8, block_k=min(1024, triton.next_power_of_2(k)), num_warps=4, num_stages=1)


def supported(x: torch.Tensor, w: torch.Tensor) -> bool:
    """True when `gemv` runs x [1, K] against w [N, K]: one row on a CUDA (or interpreted) device,
    a plain floating weight, matching dtypes."""
    on_device = x.device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"
    return (on_device and x.dim() == 2 and x.shape[0] == 1 and w.dim() == 2 and w.device == x.device
            and x.dtype in _DTYPES and w.dtype == x.dtype and w.stride(1) == 1)


@triton.jit
def _gemv_kernel(
    x_ptr, g_ptr, w_ptr, r_ptr, y_ptr,
    N, K, s_wn, eps, norm_k,
    PRO: tl.constexpr, RESIDUAL: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, PDL: tl.constexpr,
):
    pid = tl.program_id(0)
    rows = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = rows < N
    rows_c = tl.minimum(rows, N - 1)  # out-of-range rows re-read the last one: loads need no row mask
    offs_k = tl.arange(0, BLOCK_K)
    dt = y_ptr.dtype.element_ty
    w_rows = w_ptr + rows_c[:, None].to(tl.int64) * s_wn
    # the first weight tile depends on no earlier kernel: with programmatic dependent launch it
    # is in flight while the kernel before this one finishes (gdc_wait then waits for its writes)
    if EVEN_K:
        w = tl.load(w_rows + offs_k[None, :])
    else:
        w = tl.load(w_rows + offs_k[None, :], mask=(offs_k < K)[None, :], other=0.0)
    if PDL:
        tl.extra.cuda.gdc_wait()  # x (and r) come from the previous kernel
        tl.extra.cuda.gdc_launch_dependents()  # the next kernel may start loading its weights
    if PRO == 1:
        ss = tl.zeros([BLOCK_K], dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            k = k0 + offs_k
            xv = tl.load(x_ptr + k, mask=k < K, other=0.0).to(tl.float32)
            ss += xv * xv
        inv = 1.0 / tl.sqrt(tl.sum(ss, axis=0) / norm_k + eps)  # as F.rms_norm: x * rsqrt(mean(x^2) + eps)
    acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + offs_k
        k_ok = k < K
        # the next tile is loaded before this one is used (the last iteration's load is masked off)
        kn = k + BLOCK_K
        w_next = tl.load(w_rows + kn[None, :], mask=(kn < K)[None, :], other=0.0)
        if PRO == 1:
            xv = tl.load(x_ptr + k, mask=k_ok, other=0.0).to(tl.float32)
            gv = tl.load(g_ptr + k, mask=k_ok, other=0.0).to(tl.float32)
            # weight * rms_norm(x).to(dtype): the product of two dtype values, rounded to the dtype
            xv = ((xv * inv).to(dt).to(tl.float32) * gv).to(dt).to(tl.float32)
        elif PRO == 2:
            gate = tl.load(x_ptr + k, mask=k_ok, other=0.0).to(tl.float32)
            up = tl.load(x_ptr + K + k, mask=k_ok, other=0.0).to(tl.float32)
            act = (gate / (1.0 + tl.exp(-gate))).to(dt).to(tl.float32)  # F.silu rounds to the dtype, then * up
            xv = (act * up).to(dt).to(tl.float32)
        else:
            xv = tl.load(x_ptr + k, mask=k_ok, other=0.0).to(tl.float32)
        acc += w.to(tl.float32) * xv[None, :]
        w = w_next
    y = tl.sum(acc, axis=1).to(dt)
    if RESIDUAL:
        y = (y.to(tl.float32) + tl.load(r_ptr + rows, mask=n_ok, other=0.0).to(tl.float32)).to(dt)
    tl.store(y_ptr + rows, y, mask=n_ok)


@functools.lru_cache(maxsize=8)
def pdl_enabled(device: torch.device) -> bool:
    """Programmatic dependent launch: NVIDIA Hopper or newer, a Triton that has it (3.3+), compiled
    kernels only; AUGURY_GEMV_PDL=0 turns it off. Decided once per device."""
    return (device.type == "cuda" and torch.version.hip is None
            and os.environ.get("AUGURY_GEMV_PDL", "1") != "0" and os.environ.get("TRITON_INTERPRET") != "1"
            and hasattr(tl.extra.cuda, "gdc_wait") and torch.cuda.get_device_capability(device)[0] >= 9)


def gemv(x: torch.Tensor, w: torch.Tensor, *, norm_weight: torch.Tensor | None = None, eps: float = 1e-6,
         silu_mul: bool = False, residual: torch.Tensor | None = None,
         cfg: GemvConfig | None = None, pdl: bool | None = None) -> torch.Tensor:
    """x [1, K_in] -> [1, N] = W @ prologue(x) (+ residual).

    norm_weight: x is RMS-normalised over its K columns and scaled by norm_weight [K] first.
    silu_mul: x is [1, 2K] = [gate; up] and the product reads silu(gate) * up (K = w's columns).
    residual: [1, N], added to the rounded product."""
    if norm_weight is not None and silu_mul:
        raise ValueError("gemv: one prologue at a time (norm or silu_mul)")
    N, K = w.shape
    if x.shape[-1] != (2 * K if silu_mul else K):
        raise ValueError(f"gemv: x has {x.shape[-1]} columns, weight [{N}, {K}] needs "
                         f"{2 * K if silu_mul else K}")
    x = x.contiguous()
    cfg = cfg or default_config(N, K)
    y = torch.empty((1, N), dtype=x.dtype, device=x.device)
    pro = PRO_NORM if norm_weight is not None else (PRO_SILU_MUL if silu_mul else PRO_NONE)
    r = residual.contiguous() if residual is not None else y
    g = norm_weight.contiguous() if norm_weight is not None else x
    pdl = pdl_enabled(x.device) if pdl is None else pdl
    extra = {"launch_pdl": True} if pdl else {}
    _gemv_kernel[(triton.cdiv(N, cfg.block_n),)](
        x, g, w, r, y, N, K, w.stride(0), float(eps), float(K),
        PRO=pro, RESIDUAL=residual is not None, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
        EVEN_K=K % cfg.block_k == 0, PDL=pdl, num_warps=cfg.num_warps, num_stages=cfg.num_stages, **extra,
    )
    return y


# One opaque node for torch.compile (dynamo cannot trace Triton's launcher); eager calls go
# straight to `gemv`. Optional tensors are passed as real ones or None.
@torch.library.custom_op(
    "augury::gemv", mutates_args=(),
    schema="(Tensor x, Tensor w, Tensor? norm_weight, float eps, bool silu_mul, Tensor? residual) -> Tensor")
def gemv_op(x: torch.Tensor, w: torch.Tensor, norm_weight: torch.Tensor | None, eps: float, silu_mul: bool,
            residual: torch.Tensor | None) -> torch.Tensor:
    return gemv(x, w, norm_weight=norm_weight, eps=eps, silu_mul=silu_mul, residual=residual)


@gemv_op.register_fake
def _(x, w, norm_weight, eps, silu_mul, residual):
    return x.new_empty((1, w.shape[0]))


def fused_gemv(x: torch.Tensor, w: torch.Tensor, *, norm_weight: torch.Tensor | None = None,
               eps: float = 1e-6, silu_mul: bool = False, residual: torch.Tensor | None = None) -> torch.Tensor:
    """`gemv`, through the custom op while torch.compile traces."""
    if torch.compiler.is_compiling():
        return gemv_op(x, w, norm_weight, eps, silu_mul, residual)
    return gemv(x, w, norm_weight=norm_weight, eps=eps, silu_mul=silu_mul, residual=residual)
