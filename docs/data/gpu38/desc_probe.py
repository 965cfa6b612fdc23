"""Groundwork for the int4 GEMV's next step (thirty-eighth session): weights through TMA descriptor loads.

Two questions, on a Hopper GPU:
1. layout: after a [T, 4] int32 load, which thread holds row i? The w4m kernel's inline mma needs thread i to
   hold row i (16 bytes) of every [T, 4] operand; plain 16-byte pointer loads give that. Printed for pointer
   loads and for host-side TensorDescriptor loads, alone and inside a `num_stages` loop.
2. stream: GB/s of reading a large int32 buffer, every program a contiguous run of 4 x T-row blocks (a w4m
   program's W tiles of 2 KB a step), by pointer loads (num_stages 1 and 3, i.e. registers / cp.async) and by
   descriptor loads (TMA into shared memory) at num_stages 2-4.

Usage: python docs/data/gpu38/desc_probe.py [out.json]
"""

from __future__ import annotations

import json
import sys

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

TID = "mov.u32 $0, %tid.x;"


@triton.jit
def _tid_of(v):
    return tl.inline_asm_elementwise(TID, "=r,r", [v], dtype=tl.int32, is_pure=True, pack=1)


@triton.jit
def _layout_ptr(src, out, T: tl.constexpr):
    i = tl.arange(0, T)
    v = tl.load(src + i[:, None] * 4 + tl.arange(0, 4)[None, :])
    tl.store(out + i[:, None] * 4 + tl.arange(0, 4)[None, :], _tid_of(v) + v * 0)


@triton.jit
def _layout_desc(desc, out, T: tl.constexpr, LOOP: tl.constexpr):
    i = tl.arange(0, T)
    if LOOP:
        acc = tl.zeros([T, 4], dtype=tl.int32)
        for it in tl.range(0, 4, num_stages=3):
            v = desc.load([it * T, 0])
            acc += _tid_of(v) + v * 0
        r = acc // 4
    else:
        v = desc.load([0, 0])
        r = _tid_of(v) + v * 0
    tl.store(out + i[:, None] * 4 + tl.arange(0, 4)[None, :], r)


@triton.jit
def _stream_ptr(src, out, STEPS, T: tl.constexpr, STAGES: tl.constexpr):
    pid = tl.program_id(0)
    i = tl.arange(0, 4 * T)
    base = src + pid.to(tl.int64) * STEPS * (16 * T) + i[:, None] * 4 + tl.arange(0, 4)[None, :]
    acc = tl.zeros([4 * T, 4], dtype=tl.int32)
    for it in tl.range(0, STEPS, num_stages=STAGES):
        acc ^= tl.load(base + it * (16 * T))
    tl.store(out + pid, tl.xor_sum(tl.xor_sum(acc, axis=1), axis=0))


@triton.jit
def _stream_desc(desc, out, STEPS, T: tl.constexpr, STAGES: tl.constexpr):
    pid = tl.program_id(0)
    # the same bytes a step as the pointer form, as [T, 16] (a TMA box holds at most 256 rows)
    acc = tl.zeros([T, 16], dtype=tl.int32)
    for it in tl.range(0, STEPS, num_stages=STAGES):
        acc ^= desc.load([(pid * STEPS + it) * T, 0])
    tl.store(out + pid, tl.xor_sum(tl.xor_sum(acc, axis=1), axis=0))


def layouts(W: int) -> dict:
    T = 32 * W
    src = torch.arange(4 * 4 * T, dtype=torch.int32, device="cuda").reshape(4 * T, 4)
    res = {}
    out = torch.empty(T, 4, dtype=torch.int32, device="cuda")
    _layout_ptr[(1,)](src, out, T=T, num_warps=W)
    res["ptr"] = out.clone()
    desc = TensorDescriptor.from_tensor(src, [T, 4])
    for loop in (False, True):
        _layout_desc[(1,)](desc, out, T=T, LOOP=loop, num_warps=W)
        res["desc_loop" if loop else "desc"] = out.clone()
    want = torch.arange(T, device="cuda")[:, None].expand(T, 4).to(torch.int32)
    return {k: {"row_i_in_thread_i": bool(torch.equal(v, want)), "rows0_8": v[:8].tolist()} for k, v in res.items()}


def stream(W: int, mb: int = 512) -> dict:
    T = 32 * W
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    progs = 4 * sms
    block_bytes = 4 * T * 16
    steps = max(1, mb * 2**20 // (progs * block_bytes))
    n_rows = progs * steps * 4 * T
    src = torch.randint(-2**31, 2**31 - 1, (n_rows, 4), dtype=torch.int32, device="cuda")
    out = torch.empty(progs, dtype=torch.int32, device="cuda")
    gbytes = src.numel() * 4 / 1e9
    res = {"bytes_GB": gbytes, "programs": progs, "steps": steps}
    for st in (1, 3):
        f = lambda: _stream_ptr[(progs,)](src, out, steps, T=T, STAGES=st, num_warps=W)
        f()
        ref = out.clone()
        ms = triton.testing.do_bench(f, warmup=50, rep=300)
        res[f"ptr_stages{st}_GBps"] = gbytes / (ms * 1e-3)
    desc = TensorDescriptor.from_tensor(src.view(-1, 16), [T, 16])
    for st in (2, 3, 4):
        f = lambda: _stream_desc[(progs,)](desc, out, steps, T=T, STAGES=st, num_warps=W)
        f()
        res[f"desc_stages{st}_same_sum"] = bool(torch.equal(out, ref))
        ms = triton.testing.do_bench(f, warmup=50, rep=300)
        res[f"desc_stages{st}_GBps"] = gbytes / (ms * 1e-3)
    # a ceiling beside the streams: torch's device-to-device copy, read + write bytes (not the roofline's
    # reading, which is augury.bench.machine.device_read_bandwidth's bf16 sum)
    dst = torch.empty_like(src)
    ms = triton.testing.do_bench(lambda: dst.copy_(src), warmup=20, rep=200)
    res["copy_rw_GBps"] = 2 * gbytes / (ms * 1e-3)
    return res


def main() -> None:
    report = {"device": torch.cuda.get_device_name(), "triton": triton.__version__, "torch": torch.__version__}
    for W in (2, 4):
        for name, fn in (("layout", layouts), ("stream", stream)):
            try:
                report[f"{name}_W{W}"] = fn(W)
            except Exception as e:  # a probe: report what failed and go on
                report[f"{name}_W{W}"] = {"error": f"{type(e).__name__}: {e}"[:2000]}
            print(name, W, json.dumps(report[f"{name}_W{W}"]), flush=True)
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as fh:
            json.dump(report, fh, indent=1)


if __name__ == "__main__":
    main()
