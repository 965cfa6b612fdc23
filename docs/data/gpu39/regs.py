"""Registers and spills of the tensor-core int4 GEMV as this device's Triton compiles it, per Llama-3-8B product
and config (argv[1]: JSON name -> list of W4MmaConfig override dicts; {} is the default)."""
import json, sys
from dataclasses import replace
import torch
from augury.layers import int4_layout as L, triton_gemv_w4m as M

SHAPES = {"qkv": (6144, 4096, 1), "o_proj": (4096, 4096, 0), "gate_up": (28672, 4096, 1), "down": (4096, 14336, 2)}
dev = torch.device("cuda")


def compiled():
    out = {}
    for cache in M._w4_mma_kernel.device_caches.values():
        table = cache[0] if isinstance(cache, tuple) else cache
        for key, k in table.items():
            out[str(key)] = k
    return out


for name, cfgs in json.loads(sys.argv[1]).items():
    N, K, pro = SHAPES[name]
    q = torch.randint(0, 16, (N, K), device=dev, dtype=torch.uint8)
    sz = (torch.rand(K // 32, N, 2, device=dev) * 0.01).to(torch.bfloat16)
    w, s = M.pack(q, L.transpose_scales(sz))
    x = torch.randn(1, 2 * K if pro == 2 else K, device=dev, dtype=torch.bfloat16)
    y = torch.empty(1, N, device=dev, dtype=torch.bfloat16)
    res = name in ("o_proj", "down")
    for c in [{}] + cfgs:
        before = set(compiled())
        M.launch(x, x, w, s, y, y, N, K, 1e-5, (x, x, x, x, x, 0, 0, 0, 0, 0, 0), pro=pro, residual=res, rope_kv=False,
                 half=1, cfg=replace(M.default_config(N, K), **c), pdl=True)
        torch.cuda.synchronize()
        new = [k for key, k in compiled().items() if key not in before]
        print(name, json.dumps(c), [(getattr(k, "n_regs", None), getattr(k, "n_spills", None)) for k in new], flush=True)
