"""Experiment, not kept (thirty-seventh session): int4_mm's activation rows quantized inside the parallel
region (parallel_quantize.patch, kernels.h parallel_steal_after) against on the caller before it. Needs
that patch plus a switch in int4_mm: AUGURY_TMP_SERIALPRE set = quantize on the caller, then parallel_steal.
Modes: 0 static, 1 stealing + serial quantize, 2 stealing + parallel quantize. Log: parallel_quantize_ab_avx2.log.

Derived from docs/data/cpu36/sched_ab.py:
A/B of the CPU kernels' thread split (static vs own-share-first with stealing), in one process.

Alternates the two schedules (order rotating) at B=1 and B=8 greedy decode of SmolLM2 int4, 2 threads,
and checks that both schedules give the same tokens. Uses the A/B hook augury_cpu::set_steal (kernels.h parallel_steal): the int4 products and the attention units.
Usage: python docs/data/cpu36/sched_ab.py [reps] [tokens]
"""
import statistics
import sys
import time

import torch

from augury.bench.peers.augury_peer import AuguryPeer
from augury.bench.prompts import batch_prompts
from augury.engine.types import SamplingParams

torch.set_num_threads(2)
reps = int(sys.argv[1]) if len(sys.argv) > 1 else 8
ntok = int(sys.argv[2]) if len(sys.argv) > 2 else 128
p = AuguryPeer.load("smollm2", device="cpu", dtype="auto", weights="int4", threads=2, max_num_seqs=8)
prompts8 = batch_prompts(p.engine.tokenizer, 8, 32)
prompts1 = prompts8[:1]


def run(prompts):
    t0 = time.perf_counter()
    hs = [p.engine.submit(list(q), SamplingParams(max_tokens=ntok, temperature=0.0, ignore_eos=True, speculative=False))
          for q in prompts]
    toks, first = [], None
    for h in hs:
        seq = []
        for out in h:
            if first is None and out.token_ids:
                first = time.perf_counter() - t0
            seq += list(out.token_ids)
        toks.append(seq)
    tot = time.perf_counter() - t0
    n = sum(len(s) for s in toks)
    return (n - len(prompts)) / (tot - first), toks


p.generate_batch(prompts8, 16)
import os
res = {m: {1: [], 8: []} for m in (0, 1, 2)}
ref = {}
for rep in range(reps):
    order = [(0, 1, 2), (1, 2, 0), (2, 0, 1)][rep % 3]
    for B, prompts in ((1, prompts1), (8, prompts8)):
        for mode in order:
            torch.ops.augury_cpu.set_steal(mode > 0)
            if mode == 1:
                os.environ["AUGURY_TMP_SERIALPRE"] = "1"
            else:
                os.environ.pop("AUGURY_TMP_SERIALPRE", None)
            rate, toks = run(prompts)
            if (B, "toks") in ref:
                assert toks == ref[(B, "toks")], f"mode {mode} B={B}: tokens differ"
            ref[(B, "toks")] = toks
            res[mode][B].append(rate)
            print(f"rep {rep} B={B} sched={mode} decode {rate:.1f} tok/s", flush=True)
for B in (1, 8):
    for m in (1, 2):
        a, b = res[0][B], res[m][B]
        ratios = [y / x for x, y in zip(a, b)]
        print(f"B={B} mode {m}/static: medians {statistics.median(a):.1f} -> {statistics.median(b):.1f}; paired ratio median {statistics.median(ratios):.3f} (min {min(ratios):.3f} max {max(ratios):.3f})")
    r = [y / x for x, y in zip(res[2][B], res[1][B])]
    r = [y / x for x, y in zip(res[1][B], res[2][B])]
    print(f"B={B} mode 2/mode 1 (parallel pre / serial pre) paired median {statistics.median(r):.3f} (min {min(r):.3f} max {max(r):.3f})")
for mode in (0, 1, 2):
    r = [y / x for x, y in zip(res[mode][1], res[mode][8])]
    print(f"mode={mode}: B=8/B=1 paired median {statistics.median(r):.2f}")
p.close()
