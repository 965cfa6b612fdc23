"""Where a many-row GPU step's elementwise work takes one Triton launch (`triton_rows`) instead of
torch's several: silu(gate) * up and rope, on CUDA bf16 tensors in eager mode. Each returns None where
it does not apply (the caller runs torch's ops): on the CPU, in other dtypes, inside torch.compile
(inductor fuses these itself), without triton, or with AUGURY_TRITON_ROWS=0 (A/B measurements)."""

from __future__ import annotations

import functools
import os

import torch


@functools.cache
def _kernels():
    if os.environ.get("AUGURY_TRITON_ROWS", "1") == "0":
        return None
    try:
        from augury.layers import triton_rows
    except ImportError:
        return None
    return triton_rows


def _eligible(t: torch.Tensor) -> bool:
    # CUDA only: the kernels also run under TRITON_INTERPRET=1, which must not reroute CPU forwards
    return t.is_cuda and t.dtype == torch.bfloat16 and not torch.compiler.is_compiling()


def silu_mul(gu: torch.Tensor) -> torch.Tensor | None:
    """gu [T, 2I] = [gate | up] -> F.silu(gate) * up, or None (see the module)."""
    if not _eligible(gu) or (k := _kernels()) is None or not k.silu_mul_supported(gu):
        return None
    return k.silu_mul(gu)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor | None:
    """`rope.apply_rope(x, cos, sin)` or None (see the module)."""
    if not _eligible(x) or (k := _kernels()) is None or not k.rope_supported(x, cos, sin):
        return None
    return k.rope(x, cos, sin)
