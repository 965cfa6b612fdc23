# thirty-third session: the native int4 product at 1/2/4/8 rows, in cache (one layer's four SmolLM2 products, then the
# LM head, each repeated 300 times; best of 7), to see how its cost grows with rows on this AVX2 host.
import time, torch
import augury.cpu_kernels as ck
from augury.cpu_kernels.int4 import pack_int4, int4_mm
assert ck.load()
torch.manual_seed(0)
for name, shapes in (("layer's 4 products", [(960, 576), (576, 576), (3072, 576), (576, 1536)]),
                     ("LM head", [(49152, 576)])):
    ws = []
    for n, k in shapes:
        ws.append(pack_int4(torch.randint(0, 16, (n, k)), torch.rand(n, k // 32) * 0.01, torch.rand(n, k // 32)) + (k,))
    for M in (1, 2, 4, 8):
        xs = [torch.randn(M, k) for *_, k in ws]
        for _ in range(20):
            for (p, sz, k), x in zip(ws, xs): int4_mm(x, p, sz, 32)
        best = 1e9
        for rep in range(7):
            t = time.perf_counter()
            for _ in range(300):
                for (p, sz, k), x in zip(ws, xs): int4_mm(x, p, sz, 32)
            best = min(best, (time.perf_counter() - t) / 300)
        print(f"{name}, {M} rows: {best * 1e6:.1f} us", flush=True)
