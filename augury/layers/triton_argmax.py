"""The greedy choice of decode bursts on the GPU: each logits row's argmax in one launch, in Triton.

A CUDA-graph decode burst (`engine/cuda_graphs.py`) picks each step's token on the device and
feeds it to the next step. torch's argmax over one 128k-entry row runs as a single reduction
kernel that took ~28 us a step on the H200 (under the profiler, `docs/data/gpu7`), next to a
float32 copy of the logits and a copy into the burst's output: ~1% of a batch-1 Llama-3-8B
token, whose weights stream in ~3.7 ms. Here P programs per row each reduce a slice of the row
with all of its loads in flight, and the last of a row's programs to finish (an arrival
counter, as the split attention merges: `triton_splitkv.arrive_last`) reduces the P partial
results and writes the token.

The result is torch.argmax's exactly, whatever order the programs finish in: each entry
becomes one int64 key, (the value's bits in an order-preserving int32) * 2^32 + (2^32 - 1 -
index), so the largest key is the largest value and, among equal values, the lowest index;
the maximum of keys does not depend on the order they are combined in. -0.0 counts as +0.0
and NaN as larger than anything (torch returns the first NaN). The logits are read in their
own dtype: bf16 -> float32 is exact and monotone, so the argmax of a bf16 row is that of its
float32 copy. Written so it also runs under TRITON_INTERPRET=1 (tests).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from augury.layers.triton_splitkv import arrive_last, release_counter, split_counters

BLOCK = 4096  # entries a program reduces (one pass, every load in flight): 32 programs for a 128k vocab
_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def supported(logits: torch.Tensor) -> bool:
    """True when `argmax_rows` runs here: a [B, V] float row-major tensor on a CUDA device (or the
    interpreter, for tests) with fewer than 2^31 entries a row."""
    on_device = logits.device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"
    return (on_device and logits.dim() == 2 and logits.dtype in _DTYPES and logits.stride(-1) == 1
            and 0 < logits.shape[1] < 2 ** 31)


@triton.jit
def _keys(x_ptr, k, ok):
    """The int64 keys of entries k (masked-off entries get the smallest key)."""
    v = tl.load(x_ptr + k, mask=ok, other=0.0).to(tl.float32)
    v = tl.where(v == 0.0, 0.0, v)  # -0.0 -> +0.0: equal values tie on the index
    f = v.to(tl.int32, bitcast=True)
    o = tl.where(f < 0, f ^ 0x7FFFFFFF, f)  # negative floats: larger magnitude, smaller key
    o = tl.where(v != v, 0x7FFFFFFF, o)  # NaN above +inf (0x7F800000)
    key = (o.to(tl.int64) << 32) | (4294967295 - k.to(tl.int64))
    return tl.where(ok, key, -9223372036854775807 - 1)


@triton.jit
def _argmax_kernel(x_ptr, out_ptr, part_ptr, cnt_ptr, V, s_xb,
                   P: tl.constexpr, PP: tl.constexpr, BLOCK: tl.constexpr, ONE_PASS: tl.constexpr):
    b = tl.program_id(0)
    p = tl.program_id(1)
    offs = tl.arange(0, BLOCK)
    row = x_ptr + b.to(tl.int64) * s_xb
    if ONE_PASS:  # P programs, BLOCK entries each
        k = p * BLOCK + offs
        best = tl.max(_keys(row, k, k < V), axis=0)
    else:  # one program walks the whole row (no counters to be had)
        acc = tl.full([BLOCK], -9223372036854775807 - 1, tl.int64)
        for k0 in range(0, V, BLOCK):
            k = k0 + offs
            acc = tl.maximum(acc, _keys(row, k, k < V))
        best = tl.max(acc, axis=0)
    if P > 1:
        tl.store(part_ptr + b * P + p, best)
        counter = cnt_ptr + b
        if arrive_last(counter, P):
            offs_p = tl.arange(0, PP)
            parts = tl.load(part_ptr + b * P + offs_p, mask=offs_p < P, other=-9223372036854775807 - 1,
                            cache_modifier=".cg")  # written by other programs of this launch
            best = tl.max(parts, axis=0)
            tl.store(out_ptr + b, 4294967295 - (best & 4294967295))
            release_counter(counter)
    else:
        tl.store(out_ptr + b, 4294967295 - (best & 4294967295))


def argmax_rows(logits: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """logits [B, V] (bf16 / fp16 / fp32) -> [B] int64, torch.argmax(logits, -1) exactly, written into
    `out` ([B] int64, contiguous) when given. `supported(logits)` must hold. Inside a CUDA-graph
    capture that finds no counter buffer, each row takes one program (still one launch)."""
    if not supported(logits):
        raise ValueError(f"argmax_rows: a [B, V] float CUDA tensor with unit column stride, got "
                         f"{logits.dtype} {tuple(logits.shape)} on {logits.device}")
    B, V = logits.shape
    if out is None:
        out = torch.empty(B, dtype=torch.long, device=logits.device)
    elif out.shape != (B,) or out.dtype != torch.long or not out.is_contiguous() or out.device != logits.device:
        raise ValueError(f"argmax_rows: out must be a contiguous int64 [{B}] tensor on {logits.device}")
    block = min(BLOCK, triton.next_power_of_2(V))
    P = triton.cdiv(V, block)
    counters = split_counters(logits.device, B, owner="argmax") if P > 1 else None
    if P > 1 and counters is None:
        P, one_pass = 1, False
    else:
        one_pass = True
    part = torch.empty((B, P), dtype=torch.long, device=logits.device) if P > 1 else out
    _argmax_kernel[(B, P)](logits, out, part, counters if counters is not None else out, V, logits.stride(0),
                           P=P, PP=triton.next_power_of_2(P), BLOCK=block, ONE_PASS=one_pass,
                           num_warps=8 if block >= 4096 else 4)
    return out
