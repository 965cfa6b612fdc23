# A/B of the AVX2 int4 product: tile form (AUGURY_PAIRS_FROM=99) vs the row-pair form (=1), in cache, alternating
import os, time, torch, sys
import augury.cpu_kernels as ck
from augury.cpu_kernels.int4 import pack_int4, int4_mm
assert ck.load()
torch.manual_seed(0)
shapes = [(960, 576), (576, 576), (3072, 576), (576, 1536)]
ws = [pack_int4(torch.randint(0, 16, (n, k)), torch.rand(n, k // 32) * 0.01, torch.rand(n, k // 32)) + (k,) for n, k in shapes]
head = [pack_int4(torch.randint(0, 16, (49152, 576)), torch.rand(49152, 18) * 0.01, torch.rand(49152, 18)) + (576,)]
def run(ws, xs, n):
    for _ in range(n):
        for (p, sz, k), x in zip(ws, xs): int4_mm(x, p, sz, 32)
for M in [int(a) for a in sys.argv[1:]] or (1, 2, 3, 4, 8):
  for name, W, n in (("layer", ws, 200), ("head", head, 20)):
    xs = [torch.randn(M, k) for *_, k in W]
    outs = {}
    for v in ("99", "1"):
        os.environ["AUGURY_PAIRS_FROM"] = v
        outs[v] = [int4_mm(x, p, sz, 32) for (p, sz, k), x in zip(W, xs)]
    same = all(torch.equal(a, b) for a, b in zip(outs["99"], outs["1"]))
    best = {"99": 1e9, "1": 1e9}
    for rep in range(7):
        for v in ("99", "1"):
            os.environ["AUGURY_PAIRS_FROM"] = v
            run(W, xs, 3)
            t = time.perf_counter(); run(W, xs, n); best[v] = min(best[v], (time.perf_counter() - t) / n)
    print(f"{name} M={M}: tile {best['99']*1e6:.1f} us, pairs {best['1']*1e6:.1f} us, speedup {best['99']/best['1']:.2f}x, bits equal {same}", flush=True)
