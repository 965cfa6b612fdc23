"""Per product: the tinygemm-layout int4 GEMV (default) vs the row-layout kernel over configs (us per call)."""
import json, os, sys, time
import torch, torch.nn.functional as F
from augury.bench.kernels_gpu import copies_for, read_bandwidth, time_calls
from augury.layers import int4_layout as L, triton_gemv_w4 as W4, triton_gemv_w4r as R
from augury.layers.quant_linear import _pack_fn
from augury.layers.triton_gemv import gemv

dev = torch.device("cuda")
bw = read_bandwidth(dev)
SHAPES = {"qkv": (6144, 4096, 1), "o_proj": (4096, 4096, 0), "gate_up": (28672, 4096, 1), "down": (4096, 14336, 2),
          "lm_head": (128256, 4096, 0)}
CFGS = json.loads(sys.argv[1])  # name -> [[bn, e, nb, w], ...]
out = {"bw_GBps": bw / 1e9, "rows": {}}
T0 = time.time()
for name, cfgs in CFGS.items():
    N, K, pro = SHAPES[name]
    nbytes = N * K // 2 + (K // 32) * N * 4
    n = copies_for(nbytes)
    ws = []
    for i in range(n):
        g = torch.Generator(device=dev).manual_seed(i)
        q = torch.randint(0, 16, (N, K), generator=g, device=dev, dtype=torch.int32)
        sz = (torch.rand(K // 32, N, 2, generator=g, device=dev) * 0.01).to(torch.bfloat16)
        ws.append({"tg": _pack_fn("cuda", 8)(q), "rows": L.pack_rows(q), "szt": L.transpose_scales(sz), "sz": sz,
                   "q": q if i == 0 else None})
    kin = 2 * K if pro == 2 else K
    x = torch.randn(1, kin, device=dev, dtype=torch.bfloat16)
    gam = torch.rand(K, device=dev, dtype=torch.bfloat16) + 0.5
    res = name in ("o_proj", "down")
    r = torch.randn(1, N, device=dev, dtype=torch.bfloat16) if res else None
    y = torch.empty(1, N, device=dev, dtype=torch.bfloat16)

    def old(w):
        return gemv(x, w["tg"], scales_zeros=w["szt"], group_size=32, norm_weight=gam if pro == 1 else None, eps=1e-5,
                    silu_mul=pro == 2, residual=r)

    def new(w, cfg, blocked=False):
        key = (cfg.block_n, cfg.entries)
        if blocked and key not in w:
            w[key] = L.block_rows(w["rows"], w["szt"], *key)
        wr, sr = w[key] if blocked else (w["rows"], w["szt"])
        R.launch(x, gam if pro == 1 else x, wr, sr, r if res else y, y, N, K, 1e-5,
                 (x, x, x, x, x, 0, 0, 0, 0, 0, 0), pro=pro, residual=res, rope_kv=False, half=1, group_size=32,
                 cfg=cfg, pdl=True, blocked=blocked)
        return y

    ref = old(ws[0]).float().clone()
    row = {"N": N, "K": K, "MB": nbytes / 1e6}
    t = time_calls([lambda w=w: old(w) for w in ws], dev)
    row["old_us"] = t
    print(f"{name}: old {t:.1f} us ({nbytes / t / 1e-6 / bw:.1%})", flush=True)
    for c in cfgs:
        cfg = R.W4RowsConfig(*c[:4], stages=c[4] if len(c) > 4 else 1)
        bl = len(c) > 5 and bool(c[5])
        yv = new(ws[0], cfg, bl).float()
        err = (yv - ref).abs().max().item() / ref.abs().max().item()
        tt = time_calls([lambda w=w: new(w, cfg, bl) for w in ws], dev)
        row[str(c)] = {"us": tt, "err": err}
        for w in ws:
            w.pop((cfg.block_n, cfg.entries), None)
        print(f"  rows {c}: {tt:.1f} us ({nbytes / tt / 1e-6 / bw:.1%}) err {err:.1e}  [{time.time() - T0:.0f} s]", flush=True)
    out["rows"][name] = row
    del ws
    torch.cuda.empty_cache()
json.dump(out, open(os.path.join(os.environ.get("OUT", "/tmp"), "w4r_probe.json"), "w"), indent=1)
