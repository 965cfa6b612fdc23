"""Per product: the row-layout int4 GEMV (`triton_gemv_w4r`, its defaults) against the tensor-core GEMV
(`triton_gemv_w4m`) over launch configs, us per call (CUDA-graph replays over L2-busting copies), and
each config's max deviation from the row-layout product (relative to its max)."""
import json, os, sys, time
import torch
from augury.bench.kernels_gpu import copies_for, read_bandwidth, time_calls
from augury.layers import int4_layout as L, triton_gemv_w4m as M, triton_gemv_w4r as R
from augury.layers.triton_gemv import gemv

dev = torch.device("cuda")
bw = read_bandwidth(dev)
SHAPES = {"qkv": (6144, 4096, 1), "o_proj": (4096, 4096, 0), "gate_up": (28672, 4096, 1), "down": (4096, 14336, 2),
          "lm_head": (128256, 4096, 0)}
CFGS = json.loads(sys.argv[1])  # name -> [[rows_per_program, num_warps], ...]
out = {"bw_GBps": bw / 1e9, "rows": {}}
T0 = time.time()
for name, cfgs in CFGS.items():
    N, K, pro = SHAPES[name]
    nbytes = N * K // 2 + (K // 32) * N * 4
    n = copies_for(nbytes)
    ws = []
    for i in range(n):
        g = torch.Generator(device=dev).manual_seed(i)
        q = torch.randint(0, 16, (N, K), generator=g, device=dev, dtype=torch.uint8)
        sz = (torch.rand(K // 32, N, 2, generator=g, device=dev) * 0.01).to(torch.bfloat16)
        szt = L.transpose_scales(sz)
        wr, sr = R.pack(q, szt, 32)
        wm, sm = M.pack(q, szt)
        ws.append({"r": (wr, sr), "m": (wm, sm)})
        del q
    kin = 2 * K if pro == 2 else K
    x = torch.randn(1, kin, device=dev, dtype=torch.bfloat16)
    gam = torch.rand(K, device=dev, dtype=torch.bfloat16) + 0.5
    res = name in ("o_proj", "down")
    r = torch.randn(1, N, device=dev, dtype=torch.bfloat16) if res else None

    y = torch.empty(1, N, device=dev, dtype=torch.bfloat16)

    def run(w, key, cfg=None, lo=False):
        wt, st = w[key]
        if key == "r":
            return gemv(x, wt, scales_zeros=st, group_size=32, norm_weight=gam if pro == 1 else None, eps=1e-5,
                        silu_mul=pro == 2, residual=r)
        M.launch(x, gam if pro == 1 else x, wt, st, r if res else y, y, N, K, 1e-5, (x, x, x, x, x, 0, 0, 0, 0, 0, 0),
                 pro=pro, residual=res, rope_kv=False, half=1, cfg=cfg, pdl=True, loads_only=lo)
        return y

    ref = run(ws[0], "r").float().clone()
    row = {"N": N, "K": K, "MB": nbytes / 1e6}
    t = time_calls([lambda w=w: run(w, "r") for w in ws], dev)
    row["rows_us"] = t
    print(f"{name}: rows {t:.1f} us ({nbytes / t / 1e-6 / bw:.1%})", flush=True)
    for c in cfgs:
        # [rows_per_program, num_warps, prefetch, loads_only]
        cfg = M.W4MmaConfig(rows_per_program=c[0], num_warps=c[1], prefetch=c[2] if len(c) > 2 else 1)
        lo = len(c) > 3 and bool(c[3])
        try:
            yv = run(ws[0], "m", cfg, lo).float()
            err = (yv - ref).abs().max().item() / ref.abs().max().item()
            tt = time_calls([lambda w=w: run(w, "m", cfg, lo) for w in ws], dev)
        except Exception as e:  # noqa: BLE001
            print(f"  mma {c}: FAILED {type(e).__name__}: {str(e)[:300]}", flush=True)
            row[str(c)] = {"error": str(e)[:300]}
            continue
        row[str(c)] = {"us": tt, "err": err}
        print(f"  mma {c}: {tt:.1f} us ({nbytes / tt / 1e-6 / bw:.1%}) err {err:.1e}  [{time.time() - T0:.0f} s]",
              flush=True)
    out["rows"][name] = row
    del ws
    torch.cuda.empty_cache()
json.dump(out, open(os.path.join(os.environ.get("OUT", "/tmp"), "w4m_probe.json"), "w"), indent=1)
