"""Where a many-row GPU step's elementwise work takes fewer launches than torch's eager ops, with the
same bits: silu(gate) * up, rope and (opt-in) RMSNorm's weight product in one Triton launch each (`triton_rows`),
and RMSNorm's statistics straight on the bf16 rows (torch's kernel reads them in float32 either way:
checked bitwise on the H200, `docs/data/gpu27`), on CUDA bf16 tensors in eager mode. Each returns None
(or False) where it does not apply and the caller runs torch's ops: on the CPU, in other dtypes, inside
torch.compile (inductor fuses these itself), without triton, or switched off. AUGURY_TRITON_ROWS: unset, every
step but mul_rows (`DEFAULT`); 0 none; 1 all four; or a comma list of silu_mul, rope, mul_rows, norm (A/B runs)."""

from __future__ import annotations

import functools
import os

import torch


STEPS = ("silu_mul", "rope", "mul_rows", "norm")
# on unless AUGURY_TRITON_ROWS says otherwise. mul_rows is opt-in: its GPU time is a third of torch's broadcast
# product, but each eager launch pays Triton's Python launcher for a ~7 us saving, and an eager 8B prefill is
# partly host-bound: 32.5k tok/s with it against 35.1k without (B=64 decode in CUDA graphs: 67.9% against 67.1%
# of its limit, one run each; docs/benchmarks.md, twenty-seventh session)
DEFAULT = frozenset(("silu_mul", "rope", "norm"))


@functools.cache
def _on() -> frozenset:
    """The steps switched on by AUGURY_TRITON_ROWS (re-read after `reset()`)."""
    v = os.environ.get("AUGURY_TRITON_ROWS", "").strip()
    if v == "":
        return DEFAULT
    if v == "1":
        return frozenset(STEPS)
    if v == "0":
        return frozenset()
    steps = frozenset(x.strip() for x in v.split(",") if x.strip())
    if not steps <= set(STEPS):
        raise ValueError(f"AUGURY_TRITON_ROWS={v!r}: 0, 1 or a comma list of {', '.join(STEPS)}")
    return steps


@functools.cache
def _module():
    try:
        from augury.layers import triton_rows
    except ImportError:
        return None
    return triton_rows


def _kernels(step: str):
    """triton_rows when `step` is on and triton imports, else None."""
    return _module() if step in _on() else None


def reset() -> None:
    """Re-read AUGURY_TRITON_ROWS (tests and A/B scripts switch steps within one process)."""
    _on.cache_clear()


def _eligible(t: torch.Tensor) -> bool:
    # CUDA only: the kernels also run under TRITON_INTERPRET=1, which must not reroute CPU forwards
    return t.is_cuda and t.dtype == torch.bfloat16 and not torch.compiler.is_compiling()


def silu_mul(gu: torch.Tensor) -> torch.Tensor | None:
    """gu [T, 2I] = [gate | up] -> F.silu(gate) * up, or None (see the module)."""
    if not _eligible(gu) or (k := _kernels("silu_mul")) is None or not k.silu_mul_supported(gu):
        return None
    return k.silu_mul(gu)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor | None:
    """`rope.apply_rope(x, cos, sin)` or None (see the module)."""
    if not _eligible(x) or (k := _kernels("rope")) is None or not k.rope_supported(x, cos, sin):
        return None
    return k.rope(x, cos, sin)


def mul_rows(h: torch.Tensor, w: torch.Tensor) -> torch.Tensor | None:
    """w * h (h [T, D], w [D]) or None (see the module)."""
    if not _eligible(h) or (k := _kernels("mul_rows")) is None or not k.mul_rows_supported(h, w):
        return None
    return k.mul_rows(h, w)


def norm_in_dtype(x: torch.Tensor) -> bool:
    """Whether F.rms_norm may read x in its own dtype instead of a float32 copy (see the module)."""
    return _eligible(x) and "norm" in _on()
