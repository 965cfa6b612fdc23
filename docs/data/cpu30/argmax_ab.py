"""A/B of the native argmax in one engine: rounds alternate native / torch (argmax_last's `available`
switched off), B=1 and B=8 each round. Usage: python argmax_ab.py ROUNDS"""
import statistics as stt
import sys

import torch

import augury.cpu_kernels.argmax as am
from augury.bench.peers.augury_peer import AuguryPeer
from augury.bench.prompts import batch_prompts

torch.set_num_threads(2)
p = AuguryPeer.load("smollm2", device="cpu", dtype="auto", weights="int4", threads=2, max_num_seqs=8)
pr = {b: batch_prompts(p.engine.tokenizer, b, 32) for b in (1, 8)}
for b in (1, 8):
    p.generate_batch(pr[b], 16)
on = am.available
r = {(v, b): [] for v in ("native", "torch") for b in (1, 8)}
for i in range(int(sys.argv[1])):
    for v in (("native", "torch") if i % 2 == 0 else ("torch", "native")):
        am.available = on if v == "native" else (lambda: False)
        for b in (1, 8):
            r[(v, b)].append(p.generate_batch(pr[b], 128).rate)
for v in ("native", "torch"):
    m1, m8 = stt.median(r[(v, 1)]), stt.median(r[(v, 8)])
    print(f"{v}: B=1 {m1:.0f} B=8 {m8:.0f} tok/s, B=8/B=1 {m8 / m1:.2f}; per round B=1 "
          f"{[round(x) for x in r[(v, 1)]]} B=8 {[round(x) for x in r[(v, 8)]]}", flush=True)
p.close()
