"""Per product: the tensor-core int4 GEMV (`triton_gemv_w4m`) at its defaults and with fields overridden,
us per call (CUDA-graph replays over L2-busting copies), against the bf16 GEMV streaming the same number of
bytes (a [rows, K] bf16 weight of the int4 weight's size: how the bf16 kernel's structure reads them).
argv[1]: JSON name -> list of override dicts (W4MmaConfig fields; "lo": 1 for the loads-only probe)."""
import json, os, sys, time
from dataclasses import replace
import torch
from augury.bench.kernels_gpu import copies_for, read_bandwidth, time_calls
from augury.layers import int4_layout as L, triton_gemv_w4m as M
from augury.layers.triton_gemv import gemv

dev = torch.device("cuda")
bw = read_bandwidth(dev)
SHAPES = {"qkv": (6144, 4096, 1), "o_proj": (4096, 4096, 0), "gate_up": (28672, 4096, 1), "down": (4096, 14336, 2),
          "lm_head": (128256, 4096, 0)}
CFGS = json.loads(sys.argv[1])
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
        ws.append(M.pack(q, L.transpose_scales(sz)))
        del q
    kin = 2 * K if pro == 2 else K
    x = torch.randn(1, kin, device=dev, dtype=torch.bfloat16)
    gam = torch.rand(K, device=dev, dtype=torch.bfloat16) + 0.5
    res = name in ("o_proj", "down")
    r = torch.randn(1, N, device=dev, dtype=torch.bfloat16) if res else None
    y = torch.empty(1, N, device=dev, dtype=torch.bfloat16)
    base = M.default_config(N, K)

    def run(w, cfg, lo=False):
        M.launch(x, gam if pro == 1 else x, w[0], w[1], r if res else y, y, N, K, 1e-5, (x, x, x, x, x, 0, 0, 0, 0, 0, 0),
                 pro=pro, residual=res, rope_kv=False, half=1, cfg=cfg, pdl=True, loads_only=lo)
        return y

    ref = run(ws[0], base).float().clone()
    row = {"N": N, "K": K, "MB": nbytes / 1e6, "default": str(base)}
    # the bf16 GEMV over the same bytes (its own default config for that shape)
    nb16 = nbytes // (2 * K) // 8 * 8
    wb = [torch.randn(nb16, K, device=dev, dtype=torch.bfloat16) for _ in range(copies_for(nb16 * K * 2))]
    xb = x[:, :K].contiguous()
    tb = time_calls([lambda w=w: gemv(xb, w) for w in wb], dev)
    row["bf16_same_bytes_us"] = tb
    print(f"{name}: {nbytes / 1e6:.1f} MB; bf16 GEMV over the same bytes {tb:.1f} us ({nb16 * K * 2 / tb / 1e-6 / bw:.1%})",
          flush=True)
    del wb
    for c in [{}] + cfgs:
        c = dict(c)
        lo = bool(c.pop("lo", 0))
        cfg = replace(base, **c)
        try:
            yv = run(ws[0], cfg, lo).float()
            err = (yv - ref).abs().max().item() / ref.abs().max().item()
            tt = time_calls([lambda w=w: run(w, cfg, lo) for w in ws], dev)
        except Exception as e:  # noqa: BLE001
            print(f"  {c} lo={lo}: FAILED {type(e).__name__}: {str(e)[:300]}", flush=True)
            row[json.dumps(c) + (" lo" if lo else "")] = {"error": str(e)[:300]}
            continue
        row[json.dumps(c) + (" lo" if lo else "")] = {"us": tt, "err": err}
        print(f"  {c}{' loads-only' if lo else ''}: {tt:.1f} us ({nbytes / tt / 1e-6 / bw:.1%}) err {err:.1e}"
              f"  [{time.time() - T0:.0f} s]", flush=True)
    out["rows"][name] = row
    del ws
    torch.cuda.empty_cache()
json.dump(out, open(os.path.join(os.environ.get("OUT", "/tmp"), "w4m_probe.json"), "w"), indent=1)
