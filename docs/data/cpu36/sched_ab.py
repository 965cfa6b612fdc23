"""A/B of the CPU kernels' thread split (static vs own-share-first with stealing), in one process.

Alternates the modes (order rotating) at B=1 and B=8 greedy decode of SmolLM2 int4, 2 threads, and
checks that every mode gives the same tokens. Mode 0 is the static split, mode 1 stealing, through the
A/B hook augury_cpu::set_steal (kernels.h parallel_steal: the int4 products and the attention units).
Other scripts pass more modes to `ab` (docs/data/cpu37/*_ab.py).
Usage: python docs/data/cpu36/sched_ab.py [reps] [tokens]
"""
import os
import statistics
import sys
import time

import torch

from augury.bench.peers.augury_peer import AuguryPeer
from augury.bench.prompts import batch_prompts
from augury.engine.types import SamplingParams


def decode_rate(p, prompts, ntok):
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


def ab(modes, reps, ntok):
    """modes: (name, steal, {env var: value or None}) per mode; mode 0 is the baseline of the ratios."""
    torch.set_num_threads(2)
    p = AuguryPeer.load("smollm2", device="cpu", dtype="auto", weights="int4", threads=2, max_num_seqs=8)
    prompts8 = batch_prompts(p.engine.tokenizer, 8, 32)
    p.generate_batch(prompts8, 16)
    res = {m: {1: [], 8: []} for m in range(len(modes))}
    ref = {}
    for rep in range(reps):
        order = [(rep + i) % len(modes) for i in range(len(modes))]
        for B, prompts in ((1, prompts8[:1]), (8, prompts8)):
            for m in order:
                name, steal, env = modes[m]
                torch.ops.augury_cpu.set_steal(steal)
                for k, v in env.items():  # the kernels read these per call (temporary experiment switches)
                    if v is None:
                        os.environ.pop(k, None)
                    else:
                        os.environ[k] = v
                rate, toks = decode_rate(p, prompts, ntok)
                assert ref.setdefault(B, toks) == toks, f"mode {name} B={B}: tokens differ"
                res[m][B].append(rate)
                print(f"rep {rep} B={B} mode={name} decode {rate:.1f} tok/s", flush=True)
    for B in (1, 8):
        base = res[0][B]
        print(f"B={B}: {modes[0][0]} median {statistics.median(base):.1f} (min {min(base):.1f} max {max(base):.1f})")
        for m in range(1, len(modes)):
            r = [y / x for x, y in zip(base, res[m][B])]
            print(f"B={B}: {modes[m][0]} median {statistics.median(res[m][B]):.1f}; paired ratio to {modes[0][0]} "
                  f"median {statistics.median(r):.3f} (min {min(r):.3f} max {max(r):.3f})")
    for m in range(len(modes)):
        r = [y / x for x, y in zip(res[m][1], res[m][8])]
        print(f"{modes[m][0]}: B=8/B=1 paired median {statistics.median(r):.2f}")
    p.close()


if __name__ == "__main__":
    ab([("static", False, {}), ("stealing", True, {})],
       int(sys.argv[1]) if len(sys.argv) > 1 else 8, int(sys.argv[2]) if len(sys.argv) > 2 else 128)
