"""Device probe: the Gluon cp.async-staged int4 product loop (`gluon_w4m.py`) against the engine's Triton kernel
on the same packed weights, per product shape, us per call (CUDA-graph replays over L2-busting copies) and the
fraction of the measured read bandwidth. Both kernels are timed under PDL (consecutive calls overlap, as in the
engine's chain) and, for comparison, without it (the Gluon probe for its first variant only); the Triton kernel also
loads-only. Correctness: the Gluon partial sums, added over the K slices,
against the Triton kernel's output (plain x, no residual)."""
import json, os, sys, time
import torch
sys.path.insert(0, os.path.dirname(__file__))
import gluon_w4m as G
from augury.bench.kernels_gpu import copies_for, read_bandwidth, time_calls
from augury.layers import int4_layout as L, triton_gemv_w4m as M

dev = torch.device("cuda")
bw = read_bandwidth(dev)
print(f"read bandwidth {bw / 1e9:.0f} GB/s; {torch.cuda.get_device_name()}", flush=True)
# name: (N, K, [(NB, W, S), ...])
SHAPES = {
    "gate_up": (28672, 4096, [(896, 4, 4), (896, 4, 8), (448, 4, 4), (448, 2, 4), (448, 2, 8), (224, 1, 4),
                              (224, 1, 8), (448, 1, 8), (112, 1, 4)]),
    "down": (4096, 14336, [(512, 4, 4), (512, 4, 8), (256, 2, 4), (256, 2, 8), (128, 1, 4), (128, 1, 8),
                           (256, 1, 8), (64, 1, 4)]),
    "qkv": (6144, 4096, [(128, 2, 4), (128, 1, 4), (64, 1, 4), (128, 1, 8)]),
    "o_proj": (4096, 4096, [(128, 4, 4), (64, 1, 4), (32, 1, 2), (128, 1, 8)]),
}
only = sys.argv[1].split(",") if len(sys.argv) > 1 else list(SHAPES)
out = {"bw_GBps": bw / 1e9, "gpu": torch.cuda.get_device_name(), "rows": {}}
T0 = time.time()
for name in only:
    N, K, variants = SHAPES[name]
    nbytes = N * K // 2 + (K // 32) * N * 4
    ws_list = []
    for i in range(copies_for(nbytes)):
        gen = torch.Generator(device=dev).manual_seed(i)
        q = torch.randint(0, 16, (N, K), generator=gen, device=dev, dtype=torch.uint8)
        sz = (torch.rand(K // 32, N, 2, generator=gen, device=dev) * 0.01).to(torch.bfloat16)
        ws_list.append(M.pack(q, L.transpose_scales(sz)))
        del q
    x = torch.randn(1, K, device=dev, dtype=torch.bfloat16)
    y = torch.empty(1, N, device=dev, dtype=torch.bfloat16)
    base = M.default_config(N, K)

    def tri(w, pdl=True, lo=False):
        M.launch(x, x, w[0], w[1], y, y, N, K, 1e-5, (x, x, x, x, x, 0, 0, 0, 0, 0, 0), pro=0, residual=False,
                 rope_kv=False, half=1, cfg=base, pdl=pdl, loads_only=lo)
        return y

    ref = tri(ws_list[0]).float().clone().view(-1)
    op = G.prep_operands(x)
    part = torch.zeros(K // 256, N, device=dev, dtype=torch.float32)
    row = {"N": N, "K": K, "MB": nbytes / 1e6, "default": str(base)}
    frac = lambda us: nbytes / (us * 1e-6) / bw
    for tag, kw in (("triton", {}), ("triton_nopdl", {"pdl": False}), ("triton_loads_only", {"lo": True})):
        us = time_calls([lambda w=w: tri(w, **kw) for w in ws_list], dev)
        row[tag] = us
        print(f"{name} {tag}: {us:.2f} us ({frac(us):.1%})", flush=True)
    for nb, warps, st, pdl in [v + (True,) for v in variants] + [variants[0] + (False,)]:
        tag = f"gluon NB={nb} W={warps} S={st}" + ("" if pdl else " nopdl")
        try:
            part.zero_()
            G.launch(ws_list[0][0], ws_list[0][1], op, part, N, K, nb, warps, st, pdl=pdl)
            got = G.unpair(part, N)
            err = ((got - ref).abs().max() / ref.abs().max()).item()
            us = time_calls([lambda w=w: G.launch(w[0], w[1], op, part, N, K, nb, warps, st, pdl=pdl) for w in ws_list],
                            dev)
        except Exception as e:  # noqa: BLE001
            print(f"{name} {tag}: FAILED {type(e).__name__}: {str(e)[:400]}", flush=True)
            row[tag] = {"error": str(e)[:400]}
            continue
        row[tag] = {"us": us, "err": err}
        print(f"{name} {tag}: {us:.2f} us ({frac(us):.1%}) err {err:.1e}  [{time.time() - T0:.0f} s]", flush=True)
    out["rows"][name] = row
    del ws_list
    torch.cuda.empty_cache()
    json.dump(out, open(os.path.join(os.environ.get("OUT", "/tmp"), "gluon_probe.json"), "w"), indent=1)
