"""Programmatic dependent launch (PDL) for the decode kernels, decided once per device.

A kernel launched with PDL may start while the kernel before it in the stream is still
running; everything it reads from that kernel waits behind `gdc_wait`, and its own
`gdc_launch_dependents` lets the next PDL kernel start early in turn. A batch-1 decode step
is a chain of short kernels (fused products, attention), so each one's launch ramp and
first weight loads overlap the previous one's tail (docs/benchmarks.md, "Sixth session":
the fused products' chain 118.5 -> 113.8 us per layer)."""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl


@functools.lru_cache(maxsize=8)
def pdl_enabled(device: torch.device) -> bool:
    """NVIDIA Hopper or newer, a Triton that has it (3.3+), compiled kernels only (not the
    interpreter); AUGURY_GEMV_PDL=0 turns it off for every kernel that uses it."""
    return (device.type == "cuda" and torch.version.hip is None
            and os.environ.get("AUGURY_GEMV_PDL", "1") != "0" and os.environ.get("TRITON_INTERPRET") != "1"
            and hasattr(tl.extra.cuda, "gdc_wait") and torch.cuda.get_device_capability(device)[0] >= 9)


@triton.jit
def prefetch_l2(ptrs, EVICT_LAST: tl.constexpr = True):
    """Ask the L2 to fetch the lines at these addresses, without waiting for them or holding registers:
    the work a kernel can do before its `gdc_wait` for rows no earlier kernel of the step writes
    (evict-last, so the weight stream of the kernel still running does not push them out before they are
    used), or a stream's lines a few steps ahead of its loads (EVICT_LAST=False: read once, pinned by
    nothing). A hint only: it changes no result. CUDA only (inline PTX: not under the interpreter)."""
    asm: tl.constexpr = ("prefetch.global.L2::evict_last [$1];\n\tmov.u32 $0, 0;" if EVICT_LAST
                         else "prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;")
    tl.inline_asm_elementwise(asm, "=r,l", [ptrs], dtype=tl.int32, is_pure=False, pack=1)
