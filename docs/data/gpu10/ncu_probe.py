"""Runs the int4 split-K GEMV (fp16x2 products) on gate_up and the LM head for ncu: one call each."""
import torch
from augury.bench.gemv_gpu import _int4_weight
from augury.layers.int4_layout import transpose_scales
from augury.layers.triton_gemv import gemv
from augury.layers.triton_gemv_w4 import W4SplitConfig, default_config

dev = torch.device("cuda")
for N, K, cfgs in ((28672, 4096, [None, W4SplitConfig(32, 2, 512, 2, half2=False)]),
                   (128256, 4096, [None, W4SplitConfig(32, 4, 1024, 4)])):
    x = torch.randn(1, K, device=dev, dtype=torch.bfloat16)
    g = torch.rand(K, device=dev, dtype=torch.bfloat16) + 0.5
    w4 = _int4_weight(N, K, dev, 0)
    szt = transpose_scales(w4["scales_zeros"])
    for cfg in cfgs:
        print(N, K, cfg or default_config(N, K, 8), flush=True)
        for _ in range(2):
            gemv(x, w4["w"], scales_zeros=szt, group_size=32, norm_weight=g if N < 65536 else None, eps=1e-5,
                 cfg=cfg, pdl=False)
        torch.cuda.synchronize()
    del w4, szt
