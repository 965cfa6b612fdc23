"""Launch-parameter sweep of the fused encoded-KV decode kernel (augury.kv.codecs.triton_attention).

    python -m augury.bench.kv_sweep_gpu --out DIR [--schemes turbo,affine4] [--batches 1,8] [--case-s 15]

Per (scheme, batch) at 8k context, llama3-8b attention shapes, bf16: the native paged kernel
over a bf16 pool (the bar to beat), the per-element decode path at its defaults, the runs
path at its defaults, then a coordinate search of the runs path's launch parameters (block_n,
num_warps, num_stages, waves) and, at the best point, the same without the layout fence.
Every time is the median over CUDA-graph replays of one call per distinct buffer copy
(augury.bench.kernels_gpu.time_calls: launch overhead out, data beyond the L2); every
compiled configuration is checked against dequantize-then-attend before it is timed.
Writes DIR/kv_sweep.json after each case; prints a table last.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import torch

from augury.bench.kernels_gpu import (_attention_case, copies_for, coordinate_search, encoded_copies,
                                      time_calls)

MAX_DIFF = 0.05  # bf16 outputs of unit-scale attention: a wrong decode is off by O(1)


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def sweep_case(name: str, B: int, ctx: int, H: int, Hkv: int, D: int, dev: torch.device, case_s: float,
               dt: torch.dtype = torch.bfloat16) -> dict:
    from augury.kv.codecs import parse_codec
    from augury.kv.codecs import triton_attention as ta
    from augury.layers.attention import attend
    from augury.layers.triton_paged_decode import paged_decode_attention

    scale = D ** -0.5
    gm, n_slots = _attention_case(B, ctx, 1, H, Hkv, D, dev, dt)
    L = copies_for(B * gm.max_kv * Hkv * D * 2 * 2)
    q = torch.randn(B, H, D, device=dev, dtype=dt)
    qp, bias = q.view(B, 1, H, D), gm.additive_mask(dt)
    kp = torch.randn(n_slots, Hkv, D, device=dev, dtype=dt)
    vp = torch.randn(n_slots, Hkv, D, device=dev, dtype=dt)
    pools = [(kp, vp)] + [(kp.clone(), vp.clone()) for _ in range(L - 1)]
    native = time_calls([(lambda a=a, b=b: paged_decode_attention(qp, a, b, gm.gather_slots, bias, scale))
                         for a, b in pools], dev)
    del pools
    codec = parse_codec(name)
    codec.bind(D)
    stores = encoded_copies(codec, n_slots, D, dt, dev, kp, vp, copies=L)
    del kp, vp
    ref = attend(q, stores[0][0].read, stores[0][1].read, gm, scale, None).float()

    def call(ks, vs, **kw):
        return lambda: ta.encoded_decode_attention(qp, ks, vs, gm.gather_slots, bias, scale, None, **kw)

    def diff(**kw) -> float:
        return float((call(*stores[0], **kw)().view(B, H, D).float() - ref).abs().max())

    def timed(**kw) -> float:
        d = diff(**kw)
        if not d < MAX_DIFF:
            raise ValueError(f"max diff {d} vs dequantize-then-attend")
        return time_calls([call(ks, vs, **kw) for ks, vs in stores], dev, reps=9)

    row: dict = {"scheme": name, "batch": B, "ctx": ctx, "copies": L, "native_kernel_us": native}
    row["old_path_us"] = timed(runs=False)
    row["runs_default_us"] = timed()
    row["runs_default_max_diff"] = diff()
    ks0 = stores[0][0]
    start = ta.launch_config(B * Hkv, *ta._side_args(ks0)[3:5], *ta._side_args(stores[0][1])[3:5], runs=True)

    def kwargs(p: dict) -> dict:
        S = ta._num_splits(B * Hkv, gm.max_kv, p["block_n"], dev, waves=p["waves"])
        return dict(num_splits=S, block_n=p["block_n"], num_warps=p["num_warps"], num_stages=p["num_stages"],
                    early_v=p["early_v"], prefetch=p["prefetch"])

    def evaluate(p: dict) -> float:
        return timed(**kwargs(p))

    grid = {"block_n": [128, 64, 32, 256], "num_warps": [4, 8, 2], "waves": [2.0, 4.0, 1.0, 8.0],
            "early_v": [False, True], "prefetch": [False, True], "num_stages": [1, 2]}
    best, best_t, tried = coordinate_search(
        grid, {"block_n": start.block_n, "num_warps": start.num_warps, "waves": start.waves,
               "num_stages": start.num_stages, "early_v": start.early_v, "prefetch": start.prefetch},
        evaluate, time.perf_counter() + case_s)
    row["sweep_best"] = best | {"us": best_t}
    row["sweep_tried"] = tried
    if math.isfinite(best_t):
        row["best_without_fence_us"] = timed(**kwargs(best), fence=False)
        row["best_again_us"] = timed(**kwargs(best))  # repeatability of the winner
    row["best_vs_native"] = native / best_t
    _log(f"{name} B={B}: native {native:.1f} us, old path {row['old_path_us']:.1f}, runs default "
         f"{row['runs_default_us']:.1f}, best {best} {best_t:.1f} us ({native / best_t:.2f}x native), "
         f"no fence {row.get('best_without_fence_us', float('nan')):.1f}")
    del stores
    torch.cuda.empty_cache()
    return row


def profile_calls(name: str, B: int, ctx: int, H: int, Hkv: int, D: int, dev: torch.device) -> None:
    """The kernel at its defaults, 4 calls on one encoded cache (a profiler picks one)."""
    from augury.kv.codecs import EncodedStore, parse_codec
    from augury.kv.codecs import triton_attention as ta

    dt = torch.bfloat16
    gm, n_slots = _attention_case(B, ctx, 1, H, Hkv, D, dev, dt)
    codec = parse_codec(name)
    codec.bind(D)
    ks = EncodedStore(codec.key, n_slots, Hkv, D, dt, dev)
    vs = EncodedStore(codec.value, n_slots, Hkv, D, dt, dev)
    slots = torch.arange(n_slots, device=dev)
    ks.write(slots, torch.randn(n_slots, Hkv, D, device=dev, dtype=dt))
    vs.write(slots, torch.randn(n_slots, Hkv, D, device=dev, dtype=dt))
    q = torch.randn(B, 1, H, D, device=dev, dtype=dt)
    for _ in range(4):
        ta.encoded_decode_attention(q, ks, vs, gm.gather_slots, gm.additive_mask(dt), D ** -0.5)
    torch.cuda.synchronize()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m augury.bench.kv_sweep_gpu")
    ap.add_argument("--out", default=os.environ.get("OUT", "bench_out"))
    ap.add_argument("--schemes", default="turbo,affine4")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--ctx", type=int, default=8192)
    ap.add_argument("--case-s", type=float, default=15.0, help="search budget per (scheme, batch), seconds")
    ap.add_argument("--profile", default="", help="SCHEME:B: only call the kernel at its defaults 4 times (for ncu)")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        _log("no CUDA device")
        return 0
    dev = torch.device("cuda")
    if a.profile:
        name, B = a.profile.rsplit(":", 1)
        profile_calls(name, int(B), a.ctx, 32, 8, 128, dev)
        return 0
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    res: dict = {"device": torch.cuda.get_device_name(dev), "torch": torch.__version__, "rows": []}
    try:
        import triton

        res["triton"] = triton.__version__
    except ImportError:
        pass
    H, Hkv, D = 32, 8, 128  # llama3-8b attention
    for name in [s for s in a.schemes.split(",") if s]:
        for B in [int(b) for b in a.batches.split(",")]:
            try:
                res["rows"].append(sweep_case(name, B, a.ctx, H, Hkv, D, dev, a.case_s))
            except Exception as e:  # noqa: BLE001 - record and go on to the next case
                _log(f"{name} B={B} failed: {type(e).__name__}: {e}")
                res["rows"].append({"scheme": name, "batch": B, "error": f"{type(e).__name__}: {e}"})
            (out / "kv_sweep.json").write_text(json.dumps(res, indent=2))
    print(format_table(res))
    return 0


def format_table(res: dict) -> str:
    lines = [f"encoded decode kernel sweep on {res['device']} (us per call, 8k context)",
             f"{'scheme':<14}{'B':>3}{'native':>9}{'old':>9}{'runs':>9}{'best':>9}{'x nat':>7}  best config"]
    for r in res["rows"]:
        if "error" in r:
            lines.append(f"{r['scheme']:<14}{r['batch']:>3}  error: {r['error'][:80]}")
            continue
        b = r["sweep_best"]
        lines.append(f"{r['scheme']:<14}{r['batch']:>3}{r['native_kernel_us']:>9.1f}{r['old_path_us']:>9.1f}"
                     f"{r['runs_default_us']:>9.1f}{b['us']:>9.1f}{r['best_vs_native']:>7.2f}  "
                     f"n{b['block_n']} w{b['num_warps']} s{b['num_stages']} waves {b['waves']} ev{int(b['early_v'])}"
                     f" pf{int(b['prefetch'])} again {r.get('best_again_us', float('nan')):.1f}"
                     f" (no fence {r.get('best_without_fence_us', float('nan')):.1f})")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
