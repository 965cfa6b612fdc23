import time, torch, statistics, sys
from augury.cpu_kernels import load
from augury.cpu_kernels.int4 import pack_int4
load(); torch.set_num_threads(2)
torch.manual_seed(0)
shapes = {"qkv": (960, 576), "o": (576, 576), "gate_up": (3072, 576), "down": (576, 1536), "head": (49152, 576)}
ws = {}
for name, (n, k) in shapes.items():
    q = torch.randint(0, 16, (n, k)); s = torch.rand(n, k // 32) * 0.01; z = torch.randn(n, k // 32) * 0.01
    ws[name] = pack_int4(q, s, z)
res = {}
for m in (1, 8):
    xs = {n: torch.randn(m, k) for n, (_, k) in shapes.items()}
    # one "layer sequence" per rep, like a decode step streaming every product (cold-ish weights)
    def layer():
        for name in ("qkv", "o", "gate_up", "down"):
            torch.ops.augury_cpu.int4_mm(xs[name], *ws[name], 32)
    for _ in range(30): layer()
    ts = []
    for _ in range(15):
        t = time.perf_counter()
        for _ in range(100): layer()
        ts.append((time.perf_counter() - t) / 100 * 1e6)
    th = []
    for _ in range(15):
        t = time.perf_counter()
        for _ in range(5): torch.ops.augury_cpu.int4_mm(xs["head"], *ws["head"], 32)
        th.append((time.perf_counter() - t) / 5 * 1e6)
    print(f"M={m} layer4 med {statistics.median(ts):.1f} min {min(ts):.1f}  head med {statistics.median(th):.1f} min {min(th):.1f}", flush=True)
