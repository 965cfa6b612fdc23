# forty-first session: the AVX2 int4 tile, the current form against an experiment behind the set_avx2_form hook,
# alternating in one process, in cache; bits checked equal. Apply one patch, then `python avx2_form_ab.py LABEL`
# under AUGURY_CPU_MARCH=x86-64-v3 on AVX-512 hosts:
# - avx2_halves.patch (LABEL halves): the tile's two 8-column halves one after the other in each block, so a half's
#   int16 accumulators stay in registers; the float accumulators in L1 (log: avx2_halves_ab.log)
# - avx2_interleave.patch (LABEL interleaved): a chunk's rows' activations, d, 8*S and d*S interleaved per block, so
#   one pointer with constant offsets reaches them all (log: avx2_interleave_ab.log). With `#pragma GCC unroll 4` on
#   the i loop as well: 0.71-0.77x at 6-8 rows, so the patch leaves the loop rolled.
import sys
import time, torch
import augury.cpu_kernels as ck
from augury.cpu_kernels.int4 import pack_int4, int4_mm

label = sys.argv[1] if len(sys.argv) > 1 else "experiment"
assert ck.load()
print("isa", torch.ops.augury_cpu.int4_isa())
torch.manual_seed(0)
for name, shapes, n_in in (("layer's 4 products", [(960, 576), (576, 576), (3072, 576), (576, 1536)], 300),
                           ("LM head", [(49152, 576)], 60)):
    ws = [pack_int4(torch.randint(0, 16, (n, k)), torch.rand(n, k // 32) * 0.01, torch.rand(n, k // 32)) + (k,)
          for n, k in shapes]
    for M in (8, 6, 5, 4, 1):
        xs = [torch.randn(M, k) for *_, k in ws]
        outs = {}
        for f in (0, 1):
            torch.ops.augury_cpu.set_avx2_form(f)
            outs[f] = [int4_mm(x, p, sz, 32) for (p, sz, k), x in zip(ws, xs)]
        same = all(torch.equal(a, b) for a, b in zip(outs[0], outs[1]))
        best = {0: 1e9, 1: 1e9}
        for rep in range(7):
            for f in (0, 1):
                torch.ops.augury_cpu.set_avx2_form(f)
                for _ in range(5):
                    for (p, sz, k), x in zip(ws, xs): int4_mm(x, p, sz, 32)
                t = time.perf_counter()
                for _ in range(n_in):
                    for (p, sz, k), x in zip(ws, xs): int4_mm(x, p, sz, 32)
                best[f] = min(best[f], (time.perf_counter() - t) / n_in)
        print(f"{name}, {M} rows: current {best[0]*1e6:.1f} us, {label} {best[1]*1e6:.1f} us, "
              f"speed-up {best[0]/best[1]:.3f}x, bits equal {same}", flush=True)
torch.ops.augury_cpu.set_avx2_form(0)
