"""In-kernel timestamps for latency probes (benchmarks only).

`stamp` writes %globaltimer (ns since the epoch, comparable across multiprocessors) once the
scalar `dep` is available, so a stamp placed after a value is computed marks when that value's
loads had arrived. Kernels compile it in only under a constexpr flag (off by default); the
interpreter has no inline PTX."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def stamp(t_ptr, slot, dep):
    """%globaltimer into t_ptr[slot] (int64)."""
    d = dep.to(tl.int32)
    t = tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l,r", [d], dtype=tl.int64, is_pure=False, pack=1)
    tl.store(t_ptr + slot, t)
