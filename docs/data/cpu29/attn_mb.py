# Twenty-ninth session: run against the experiment build, whose AVX-512 path read AUGURY_ATTN_PF on every call
# ("0" off, "16" K rows 16 keys ahead, "16v" that plus the V rows asked of L2 in pass 1 -- the committed form),
# so the variants could interleave in one process. The committed switch, AUGURY_ATTN_PREFETCH=0, is read once a
# process: A/B it with separate processes (docs/data/cpu28/b8ttft.py, augury bench batch).
# attention op alone at a B=8 decode step's shapes, pools cold (weights streamed between layers), variants interleaved
import os, sys, time, torch, numpy as np
from augury.cpu_kernels import load
assert load()
torch.set_num_threads(2)
B, H, HKV, D, LAYERS = 8, 9, 3, 64, 30
L = int(sys.argv[1]) if len(sys.argv) > 1 else 96
blocks = (L + 15) // 16
S = B * blocks * 16 * 2
g = torch.Generator().manual_seed(0)
pools = [(torch.randn(S, HKV, D, generator=g), torch.randn(S, HKV, D, generator=g)) for _ in range(LAYERS)]
perm = torch.randperm(S // 16, generator=g)[: B * blocks]
gather = (perm.view(B, blocks, 1) * 16 + torch.arange(16)).view(B, blocks * 16)[:, :L].contiguous().long()
rows = torch.tensor([[b, 0, L] for b in range(B)], dtype=torch.int32)
q = torch.randn(B, H, D, generator=g)
weights = torch.empty(LAYERS * 2_400_000 // 4 * 4 // 4, dtype=torch.int32).fill_(1)  # ~72 MB streamed per step
chunk = weights.numel() // LAYERS
op = torch.ops.augury_cpu.paged_attention_rows
ref = {}
VARS = tuple(os.environ.get("VARS", "0,1").split(","))
res = {v: [] for v in VARS}
for rnd in range(40):
    for v in (VARS if rnd % 2 == 0 else VARS[::-1]):
        os.environ["AUGURY_ATTN_PF"] = v
        tot = 0.0
        for li, (k, vv) in enumerate(pools):
            weights[li * chunk:(li + 1) * chunk].sum()
            t0 = time.perf_counter()
            o = op(q, k, vv, gather, rows, 0.125, True)
            tot += time.perf_counter() - t0
            if li == 0:
                if v in ref: assert torch.equal(ref[v], o)
                ref[v] = o
        res[v].append(tot / LAYERS * 1e6)
assert all(torch.equal(ref[VARS[0]], ref[v]) for v in VARS), "prefetch changed bits"
for v in res:
    a = np.array(res[v][4:])
    print(f"L={L} pf={v}: median {np.median(a):.1f} us/layer (min {a.min():.1f}, max {a.max():.1f})")
