"""Forty-third session: the batch bench's shape (32-token prompts, 128 tokens each) in a loop, for perf/py-spy.
Usage: python docs/data/cpu43/bloop.py B REPS   (prints aggregate and decode-only tok/s a repetition)"""
import sys, time, torch
from augury.bench.peers.augury_peer import AuguryPeer
from augury.bench.prompts import batch_prompts
torch.set_num_threads(2)
B = int(sys.argv[1]); N = int(sys.argv[2]) if len(sys.argv) > 2 else 4
p = AuguryPeer.load("smollm2", device="cpu", dtype="auto", weights="int4", threads=2, max_num_seqs=max(8, B))
prompts = batch_prompts(p.engine.tokenizer, B, 32)
p.generate_batch(prompts, 16)
for rep in range(N):
    bt = p.generate_batch(prompts, 128)
    print(f"B={B} {bt}", flush=True)
p.close()
