"""ncu probe of the tensor-core int4 GEMV on gate_up and down (the twenty-fifth session's probe, with the configs
from argv): `python ncu_probe.py '[{"persistent": 4}, {"persistent": 4, "lo": 1}]'` runs the default config and
each listed one (`lo`: the loads-only probe), one warm-up call then one profiled call each, no PDL."""
import json
import sys
from dataclasses import replace
import torch
from augury.layers import int4_layout as L, triton_gemv_w4m as M

extra = json.loads(sys.argv[1]) if len(sys.argv) > 1 else []
dev = torch.device("cuda")
for N, K, pro in ((28672, 4096, 1), (4096, 14336, 2)):
    q = torch.randint(0, 16, (N, K), device=dev, dtype=torch.uint8)
    sz = (torch.rand(K // 32, N, 2, device=dev) * 0.01).to(torch.bfloat16)
    w, s = M.pack(q, L.transpose_scales(sz))
    del q
    x = torch.randn(1, 2 * K if pro == 2 else K, device=dev, dtype=torch.bfloat16)
    gam = torch.rand(K, device=dev, dtype=torch.bfloat16) + 0.5
    res = pro == 2
    y = torch.empty(1, N, device=dev, dtype=torch.bfloat16)
    r = torch.randn(1, N, device=dev, dtype=torch.bfloat16)
    base = M.default_config(N, K)
    runs = [(base, False)] + [(replace(base, **{k: v for k, v in e.items() if k != "lo"}), bool(e.get("lo")))
                              for e in extra]
    for cfg, lo in runs:
        print(N, K, cfg, "loads-only" if lo else "", flush=True)
        for _ in range(2):
            M.launch(x, gam if pro == 1 else x, w, s, r if res else y, y, N, K, 1e-5, (x, x, x, x, x, 0, 0, 0, 0, 0, 0),
                     pro=pro, residual=res, rope_kv=False, half=1, cfg=cfg, pdl=False, loads_only=lo)
        torch.cuda.synchronize()
    del w, s
