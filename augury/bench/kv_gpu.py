"""GPU benchmark of encoded KV: fused encoded decode vs native decode at long context,
and the longest context a fixed KV budget holds per codec.

    python -m augury.bench.kv_gpu --out DIR [--schemes turbo,turbo:rk4v3] [--ctx 8192] [--quick]

Three parts, each printed as it finishes and written to DIR/kv_gpu.json:
1. attention only (one layer, 8B shapes): native paged attention vs the fused Triton
   kernel vs dequantize-then-attend, per batch size, plus the fused/eager max difference;
2. engine decode (random-weight llama3-8b, bf16, CUDA graphs): B=1 and B=8 at ~ctx tokens,
   prompts prefilled first (then reused as prefix hits) so only decode steps are timed;
3. capacity: tokens a fixed KV budget holds (the engine's own block plan) and
   `augury.fit`'s longest context at that budget, native vs each codec.
Targets from issue 7: fused decode >= 0.9x native; longest context >= 3.5x native.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from augury.bench.kernels_gpu import encoded_copies
from augury.bench.roofline import timed_decode
from augury.config import ModelConfig
from augury.engine.random_model import SHAPES
from augury.engine.types import SamplingParams
from augury.kv.codecs import EncodedStore, parse_codec
from augury.kv.pool import parse_bytes, plan_groups


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _median_ms(fn, iters: int, device: torch.device) -> float:
    if device.type != "cuda":  # CPU dry runs: wall clock
        fn()
        ts = []
        for _ in range(iters):
            t = time.perf_counter()
            fn()
            ts.append((time.perf_counter() - t) * 1e3)
        return statistics.median(ts)
    start = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    end = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    for s, e in zip(start, end):
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(start, end))


def attention_only(cfg: ModelConfig, schemes: list[str], ctx: int, batches: list[int], iters: int,
                   dev: torch.device) -> list[dict]:
    """One layer's decode attention at `ctx` cached tokens, ms per call (median)."""
    from augury.kv.codecs.attention import encoded_paged_attention
    from augury.layers.attention import SeqSpec, build_attention_metadata, paged_attention

    dt = torch.bfloat16
    H, Hkv, D, bs = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, 16
    scale = D ** -0.5
    rows = []
    for B in batches:
        per = -(-(ctx + 1) // bs)
        specs = [SeqSpec(ctx, 1, {"full": list(range(i * per, (i + 1) * per))}) for i in range(B)]
        gm = build_attention_metadata(specs, bs, {"full": None}, dev).groups["full"]
        slots = B * per * bs
        q = torch.randn(B, H, D, device=dev, dtype=dt)
        k = torch.randn(B, Hkv, D, device=dev, dtype=dt)
        v = torch.randn(B, Hkv, D, device=dev, dtype=dt)
        kp = torch.randn(slots, Hkv, D, device=dev, dtype=dt)
        vp = torch.randn(slots, Hkv, D, device=dev, dtype=dt)
        native = _median_ms(lambda: paged_attention(q, k, v, kp, vp, gm, scale, None), iters, dev)
        row = {"batch": B, "ctx": ctx, "native_ms": native}
        if dev.type == "cuda":  # the Triton paged kernel over the same native pool (not wired into the engine yet)
            from augury.layers.triton_paged_decode import paged_decode_attention

            qp, bias = q.view(B, 1, H, D), gm.additive_mask(dt)
            row["native_kernel_ms"] = _median_ms(
                lambda: paged_decode_attention(qp, kp, vp, gm.gather_slots, bias, scale), iters, dev)
        for name in schemes:
            codec = parse_codec(name)
            codec.bind(D)
            (ks, vs), = encoded_copies(codec, slots, D, dt, dev, kp, vp)  # the cache holds encoded random rows
            fused_out = encoded_paged_attention(q, k, v, ks, vs, gm, scale, None)
            fused = _median_ms(lambda: encoded_paged_attention(q, k, v, ks, vs, gm, scale, None), iters, dev)
            ks.fused = vs.fused = False
            eager_out = encoded_paged_attention(q, k, v, ks, vs, gm, scale, None)
            eager = _median_ms(lambda: encoded_paged_attention(q, k, v, ks, vs, gm, scale, None), max(3, iters // 4), dev)
            row[name] = {"fused_ms": fused, "eager_ms": eager, "fused_vs_native": native / fused,
                         "fused_vs_native_kernel": row.get("native_kernel_ms", float("nan")) / fused,
                         "max_abs_diff_fused_vs_eager": float((fused_out.float() - eager_out.float()).abs().max())}
            del ks, vs
            _free(dev)
        rows.append(row)
        _log(f"attention B={B} ctx={ctx}: {json.dumps(row)}")
        del kp, vp
        _free(dev)
    return rows


def prefilled_prompts(engine, batch: int, prompt_len: int, seed: int) -> list[list[int]]:
    """Random prompts, prefilled once (max_tokens=1) so later runs start decoding at once (prefix hits)."""
    V = engine.model_config.vocab_size
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(0, V, (prompt_len,), generator=g).tolist() for _ in range(batch)]
    for p in prompts:
        engine.generate(p, SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True))
    return prompts


def _decode_tok_s(engine, batch: int, prompt_len: int, new_tokens: int, reps: int, seed: int) -> dict:
    """Aggregate decode tok/s: prompts are prefilled once (max_tokens=1), then rerun as
    prefix hits so every request starts decoding in the same step; only decode is timed."""
    prompts = prefilled_prompts(engine, batch, prompt_len, seed)
    sp = SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True)
    rates, cached = [], []
    for r in range(reps + 1):
        n, dt, firsts = timed_decode(engine, prompts, sp)
        cached.append(min(f.cached_tokens for f in firsts))
        if r:
            rates.append(n / dt)
    return {"batch": batch, "tok_s": statistics.median(rates), "min": min(rates), "max": max(rates),
            "cached_tokens_min": min(cached)}


def _free(dev: torch.device) -> None:
    gc.collect()
    if dev.type == "cuda":
        torch.cuda.empty_cache()


def engine_decode(shape: str, schemes: list[str], ctx: int, batches: list[int], new_tokens: int, reps: int,
                  kv_budget: str, dev: torch.device) -> list[dict]:
    from augury.engine.engine import Engine
    from augury.kv.codecs.attention import fused_path_available

    rows = []
    prompt_len = ctx - new_tokens - 1
    for name in ["native"] + schemes:
        t = time.perf_counter()
        e = Engine.from_random(shape, device=str(dev), dtype="bfloat16", kv_quant=name, kv_budget=kv_budget,
                               max_model_len=ctx, max_num_seqs=max(batches), max_num_batched_tokens=8192,
                               progress=False)
        built = time.perf_counter() - t
        row: dict = {"codec": name, "codec_id": e.kv_codec.id, "build_s": built,
                     "kv_blocks": e.blocks.num_total_blocks(), "kv_pool_bytes": e.pool.nbytes()}
        k0 = e.pool.k[0]
        if isinstance(k0, EncodedStore):
            row["fused"] = fused_path_available(torch.empty(1, device=dev), k0)
        for B in batches:
            row[f"B{B}"] = _decode_tok_s(e, B, prompt_len, new_tokens, reps, seed=B)
        rows.append(row)
        _log(f"engine decode {name}: {json.dumps(row)}")
        e.shutdown()
        del e
        _free(dev)
    base = rows[0]
    for row in rows[1:]:
        for B in batches:
            row[f"B{B}"]["vs_native"] = row[f"B{B}"]["tok_s"] / base[f"B{B}"]["tok_s"]
    return rows


def capacity(shape: str, schemes: list[str], kv_budget: str, block_size: int = 16) -> list[dict]:
    """Tokens a KV budget holds (the engine's block plan) and fit's longest context, per codec."""
    from augury.fit import fit, weight_bytes

    cfg = ModelConfig.from_hf_dict(SHAPES[shape])
    budget = parse_bytes(kv_budget)
    rows = []
    for name in ["native"] + schemes:
        codec = parse_codec(name)
        groups = plan_groups(cfg, torch.bfloat16, budget, block_size, 1, 512, codec)
        tokens = sum(g.num_blocks for g in groups if g.window is None) * block_size
        w = weight_bytes(cfg, "native", torch.bfloat16)
        r = fit(cfg, 8192, 1, codec, "native", torch.bfloat16, budget_bytes=w + budget)
        rows.append({"codec": name, "codec_id": codec.id, "bits_per_element": codec.bits_per_element(cfg.head_dim,
                     torch.bfloat16), "tokens_in_budget": tokens, "fit_max_context": r.max_context})
    for row in rows:
        row["vs_native"] = row["tokens_in_budget"] / rows[0]["tokens_in_budget"]
    for row in rows:
        _log(f"capacity @ {kv_budget}: {json.dumps(row)}")
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m augury.bench.kv_gpu")
    ap.add_argument("--out", default=os.environ.get("OUT", "bench_out"))
    ap.add_argument("--shape", default="llama3-8b")
    ap.add_argument("--schemes", default="turbo,turbo:rk4v3,affine4",
                    help="comma-separated codecs besides native (names as --kv-quant takes them)")
    ap.add_argument("--ctx", type=int, default=8192)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--kv-budget", default="16GiB", help="engine KV budget, also the capacity comparison's")
    ap.add_argument("--quick", action="store_true", help="fewer repetitions, attention at B=1 only")
    ap.add_argument("--device", default="cuda", help="cuda; cpu only for a dry run of the script (small --shape/--ctx)")
    a = ap.parse_args(argv)
    schemes = [s for s in a.schemes.split(",") if s]
    batches = [int(b) for b in a.batches.split(",")]
    reps = 1 if a.quick else 2
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    res: dict = {"shape": a.shape, "ctx": a.ctx, "schemes": schemes, "torch": torch.__version__}
    res["capacity"] = capacity(a.shape, schemes, a.kv_budget)  # arithmetic: runs anywhere
    dev = torch.device(a.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        _log("no CUDA device: only the capacity table was computed")
    else:
        res["device"] = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
        t0 = time.perf_counter()
        cfg = ModelConfig.from_hf_dict(SHAPES[a.shape])
        res["attention"] = attention_only(cfg, schemes, a.ctx, batches[:1] if a.quick else batches,
                                          10 if a.quick else 30, dev)
        res["attention_s"] = time.perf_counter() - t0
        res["engine"] = engine_decode(a.shape, schemes, a.ctx, batches, a.new_tokens, reps, a.kv_budget, dev)
        res["total_s"] = time.perf_counter() - t0
    (out / "kv_gpu.json").write_text(json.dumps(res, indent=2))
    print(format_table(res))
    return 0


def format_table(res: dict) -> str:
    lines = [f"KV codecs on {res.get('device', 'cpu')} ({res['shape']}, ctx {res['ctx']})", "",
             f"{'codec':<14}{'bits/elt':>9}{'tokens@budget':>15}{'x native':>9}{'fit ctx':>10}"]
    for r in res["capacity"]:
        lines.append(f"{r['codec']:<14}{r['bits_per_element']:>9.2f}{r['tokens_in_budget']:>15}"
                     f"{r['vs_native']:>9.2f}{r['fit_max_context']:>10}")
    for row in res.get("engine", []):
        cells = [f"B={k[1:]}: {v['tok_s']:.1f} tok/s" + (f" ({v['vs_native']:.2f}x)" if "vs_native" in v else "")
                 for k, v in row.items() if k.startswith("B") and isinstance(v, dict)]
        lines.append(f"decode {row['codec']:<14}" + "  ".join(cells))
    for row in res.get("attention", []):
        cells = [f"{n}: fused {row[n]['fused_ms']:.3f} ms ({row[n]['fused_vs_native']:.2f}x), eager "
                 f"{row[n]['eager_ms']:.3f}" for n in res["schemes"] if n in row]
        lines.append(f"attention B={row['batch']} native {row['native_ms']:.3f} ms; " + "; ".join(cells))
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
