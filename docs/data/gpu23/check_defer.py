"""On the GPU: o_proj merging attention's split partials (deferred merge) against attention merging them
itself, at 8B shapes (32 heads x 128, 8 KV heads, ctx keys), bf16 (split-K GEMV) and int4 (mma layout).
Prints the largest difference of the two o_proj outputs relative to the output's largest entry, and whether
a captured graph replays bitwise."""
import sys
import torch
from augury.bench.kernels_gpu import _attention_case
from augury.bench.gemv_gpu import _chain_weight
from augury.layers.triton_gemv import gemv
from augury.layers.triton_paged_decode import paged_decode_attention, paged_decode_partials

dev = torch.device("cuda")
H, Hkv, D = 32, 8, 128
for ctx in (int(a) for a in sys.argv[1:] or ["1100", "200", "4000"]):
    gm, n_slots = _attention_case(1, ctx, 1, H, Hkv, D, dev, torch.bfloat16)
    bias = gm.additive_mask(torch.bfloat16)
    kp = torch.randn(n_slots, Hkv, D, device=dev, dtype=torch.bfloat16)
    vp = torch.randn(n_slots, Hkv, D, device=dev, dtype=torch.bfloat16)
    q = torch.randn(1, 1, H, D, device=dev, dtype=torch.bfloat16)
    h = torch.randn(1, 4096, device=dev, dtype=torch.bfloat16)
    o = paged_decode_attention(q, kp, vp, gm.gather_slots, bias, D ** -0.5).reshape(1, H * D)
    acc, ml = paged_decode_partials(q, kp, vp, gm.gather_slots, bias, D ** -0.5)
    for name, lay in (("bf16", None), ("int4-mma", "mma")):
        wt = _chain_weight(4096, 4096, dev, 1, lay)
        want = gemv(o, **wt, residual=h)
        got = gemv(acc, **wt, residual=h, merge_ml=ml)
        rel = ((got.float() - want.float()).abs().max() / want.float().abs().max()).item()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            a2, m2 = paged_decode_partials(q, kp, vp, gm.gather_slots, bias, D ** -0.5)
            y2 = gemv(a2, **wt, residual=h, merge_ml=m2)
        g.replay(); torch.cuda.synchronize()
        print(f"ctx {ctx} splits {acc.shape[0]} {name}: max |deferred - merged| / max |y| = {rel:.2e}, "
              f"graph replay bitwise: {torch.equal(y2, got)}", flush=True)
