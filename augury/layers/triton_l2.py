"""Warming the L2 cache with the next kernel's weights while a latency-bound kernel runs.

A batch-1 decode step alternates bandwidth-bound products with attention, which moves a few
MB through a chain of dependent loads and leaves the DRAM mostly idle for its ~10 us. A
kernel that has spare issue slots can ask the memory system to bring the next product's
weight into L2 meanwhile (`cp.async.bulk.prefetch.L2`, sm_90+: one instruction per thread
per chunk, no registers or shared memory held, nothing waited for); the product then reads
it from L2. A prefetch is only a hint: results never depend on it, only timing does.

`l2_prefetch` is called inside a kernel by its programs, each taking its share of the bytes;
`prefetch_plan` gives the per-thread chunk from the host. The interpreter has no inline PTX:
callers compile the call out there (a constexpr), as on GPUs before sm_90.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl


def prefetch_supported(device: torch.device) -> bool:
    """Compiled kernels on an NVIDIA GPU of compute capability 9.0+ (not the interpreter)."""
    return (device.type == "cuda" and torch.version.hip is None and os.environ.get("TRITON_INTERPRET") != "1"
            and torch.cuda.get_device_capability(device)[0] >= 9)


def prefetch_plan(nbytes: int, programs: int, threads: int) -> int:
    """Bytes per thread (a multiple of 16, as the instruction needs) so `programs` programs of
    `threads` threads cover `nbytes`."""
    per = -(-nbytes // (programs * threads))
    return max(16, -(-per // 16) * 16)


@triton.jit
def l2_prefetch(base_ptr, nbytes, chunk, pid, n_prog, THREADS: tl.constexpr):
    """Program `pid` of `n_prog` asks for its threads' chunks of the `nbytes` bytes at base_ptr
    (16-byte aligned) to be brought into L2. Chunk t of program p starts at (p + t * n_prog) *
    chunk; sizes are cut to whole 16-byte units (a tail under 16 bytes is left out)."""
    t = tl.arange(0, THREADS).to(tl.int64)
    off = (pid + t * n_prog) * chunk
    size = (tl.minimum(nbytes - off, chunk) // 16 * 16).to(tl.int32)
    addr = base_ptr.to(tl.int64) + off
    tl.inline_asm_elementwise(
        "{ .reg .pred p; setp.gt.s32 p, $2, 0; @p cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }",
        "=r,l,r", [addr, size], dtype=tl.int32, is_pure=False, pack=1)
