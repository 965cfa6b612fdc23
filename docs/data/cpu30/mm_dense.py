import time, torch, statistics
import torch.nn.functional as F
from augury.cpu_kernels import load
from augury.cpu_kernels.int4 import pack_int4
load(); torch.set_num_threads(2); torch.manual_seed(0)
shapes = {"qkv": (960, 576), "o": (576, 576), "gate_up": (3072, 576), "down": (576, 1536)}
ws, dw = {}, {}
for name, (n, k) in shapes.items():
    q = torch.randint(0, 16, (n, k)); s = torch.rand(n, k // 32) * 0.01; z = torch.randn(n, k // 32) * 0.01
    ws[name] = pack_int4(q, s, z); dw[name] = torch.randn(n, k).to(torch.bfloat16)
for m in (16, 32, 64, 256, 512):
    xs = {n: torch.randn(m, k) for n, (_, k) in shapes.items()}
    def a():
        for name in shapes: torch.ops.augury_cpu.int4_mm(xs[name], *ws[name], 32)
    def b():
        for name in shapes: F.linear(xs[name].to(torch.bfloat16), dw[name]).to(torch.float32)
    res = {}
    for f in (a, b): f(); f()
    ta, tb = [], []
    for r in range(12):
        for f, t in ((a, ta), (b, tb)):
            t0 = time.perf_counter(); f(); f(); t.append((time.perf_counter() - t0) / 2 * 1e6)
    print(f"M={m} int4_mm {statistics.median(ta):.0f} us  bf16 dense {statistics.median(tb):.0f} us  ratio {statistics.median(tb)/statistics.median(ta):.2f}", flush=True)
