"""Engine decode with encoded KV vs native, measured in pairs so machine drift cancels.

    python -m augury.bench.kv_gpu_paired --out DIR [--schemes turbo,affine4] [--ctx 8192] [--reps 6]

`kv_gpu.py` builds one engine per codec and times each in turn; on the H200 its native
B=8 figure moved by 10-25% between runs, more than the effect being measured. Here every
engine is built first (random llama3-8b weights, bf16, CUDA graphs, one KV budget), its
prompts are prefilled once, and then each repetition times every engine back to back at
each batch size. The ratio is taken within a repetition (codec / the native run next to
it) and reported as the median over repetitions with its min and max.
Target from issue 7: fused encoded decode >= 0.9x native at 8k context.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from augury.bench.kv_gpu import prefilled_prompts
from augury.bench.roofline import timed_decode
from augury.engine.types import SamplingParams


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def paired_ratios(rates: dict[str, list[float]], base: str = "native") -> dict[str, dict]:
    """Per-repetition ratio of each engine to the base run of the same repetition -> median, min, max."""
    out = {}
    for name, rs in rates.items():
        if name == base:
            continue
        r = [a / b for a, b in zip(rs, rates[base])]
        out[name] = {"median": statistics.median(r), "min": min(r), "max": max(r), "per_rep": r}
    return out


def main(argv: list[str] | None = None) -> int:
    from augury.engine.engine import Engine

    ap = argparse.ArgumentParser(prog="python -m augury.bench.kv_gpu_paired")
    ap.add_argument("--out", default=os.environ.get("OUT", "bench_out"))
    ap.add_argument("--shape", default="llama3-8b")
    ap.add_argument("--schemes", default="turbo,affine4")
    ap.add_argument("--ctx", type=int, default=8192)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--reps", type=int, default=6)
    ap.add_argument("--kv-budget", default="10GiB", help="per engine; native needs ~1.1 GB per 8k-token request")
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args(argv)
    names = ["native"] + [s for s in a.schemes.split(",") if s]
    batches = [int(b) for b in a.batches.split(",")]
    t0 = time.perf_counter()
    engines, prompts = {}, {}
    for name in names:
        engines[name] = Engine.from_random(a.shape, device=a.device, dtype="bfloat16", kv_quant=name,
                                           kv_budget=a.kv_budget, max_model_len=a.ctx, max_num_seqs=max(batches),
                                           max_num_batched_tokens=8192, progress=False)
        prompts[name] = {B: prefilled_prompts(engines[name], B, a.ctx - a.new_tokens - 1, seed=B) for B in batches}
        _log(f"built and prefilled {name} ({time.perf_counter() - t0:.0f} s)")
    sp = SamplingParams(max_tokens=a.new_tokens, temperature=0.0, ignore_eos=True)
    rates = {B: {n: [] for n in names} for B in batches}
    for r in range(a.reps + 1):  # repetition 0 warms up every engine at every size
        for B in batches:
            order = names if r % 2 else names[::-1]  # alternate who goes first
            for n in order:
                k, dt, _ = timed_decode(engines[n], prompts[n][B], sp)
                if r:
                    rates[B][n].append(k / dt)
        if r:
            _log(f"rep {r}: " + "; ".join(f"B={B} " + ", ".join(f"{n} {rates[B][n][-1]:.1f}" for n in names)
                                          for B in batches))
    res = {"shape": a.shape, "ctx": a.ctx, "reps": a.reps, "new_tokens": a.new_tokens, "torch": torch.__version__,
           "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
           "codec_ids": {n: e.kv_codec.id for n, e in engines.items()},
           "batches": {f"B{B}": {"tok_s": {n: statistics.median(v) for n, v in rates[B].items()},
                                 "samples": rates[B], "vs_native": paired_ratios(rates[B])} for B in batches},
           "total_s": time.perf_counter() - t0}
    for e in engines.values():
        e.shutdown()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "kv_gpu_paired.json").write_text(json.dumps(res, indent=2))
    for B in batches:
        row = res["batches"][f"B{B}"]
        print(f"B={B}: " + ", ".join(f"{n} {v:.1f} tok/s" for n, v in row["tok_s"].items()) + " | " +
              ", ".join(f"{n} {d['median']:.3f}x native (min {d['min']:.3f}, max {d['max']:.3f})"
                        for n, d in row["vs_native"].items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
