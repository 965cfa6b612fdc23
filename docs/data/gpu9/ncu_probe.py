"""Runs each gate_up-shaped one-row product (bf16 GEMV, int4 row GEMV, int4 split GEMV, tinygemm) a few times for ncu."""
import torch, torch.nn.functional as F
from augury.bench.gemv_gpu import _int4_weight
from augury.layers.int4_layout import transpose_scales
from augury.layers.triton_gemv import gemv, GemvConfig
from augury.layers.triton_gemv_w4 import W4SplitConfig
dev = torch.device("cuda"); N, K = 28672, 4096
x = torch.randn(1, K, device=dev, dtype=torch.bfloat16); g = torch.rand(K, device=dev, dtype=torch.bfloat16) + 0.5
wb = torch.randn(N, K, device=dev, dtype=torch.bfloat16) * 0.02
w4 = _int4_weight(N, K, dev, 0); szt = transpose_scales(w4["scales_zeros"])
runs = [("bf16", lambda: gemv(x, wb, norm_weight=g, eps=1e-5, pdl=False)),
        ("int4rows", lambda: gemv(x, w4["w"], scales_zeros=w4["scales_zeros"], group_size=32, norm_weight=g, eps=1e-5,
                                  cfg=GemvConfig(block_n=16, block_k=1024, xmode=3), pdl=False)),
        ("int4split", lambda: gemv(x, w4["w"], scales_zeros=szt, group_size=32, norm_weight=g, eps=1e-5,
                                   cfg=W4SplitConfig(16, 4, 256, 4), pdl=False)),
        ("tinygemm", lambda: torch.ops.aten._weight_int4pack_mm(x, w4["w"], 32, w4["scales_zeros"]))]
for name, f in runs:
    for _ in range(3):
        f()
    torch.cuda.synchronize()
    print(name, "done", flush=True)
