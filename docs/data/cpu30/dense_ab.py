"""A/B in one engine: CPU int4 prefill with the bf16 dense copies (the old rule on AVX-512 BF16 hosts)
against augury's int4 kernel for every row count. Variants alternate within each round."""
import sys, time, statistics as stt, torch
from augury.bench.peers.augury_peer import AuguryPeer
from augury.bench.prompts import batch_prompts, filler_ids
from augury.layers import cpu_decode
from augury.layers.quant_linear import Int4Linear, keep_dense_copies
torch.set_num_threads(2)
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 4
p = AuguryPeer.load("smollm2", device="cpu", dtype="auto", weights="int4", threads=2, max_num_seqs=16)
model = p.engine.core.runner.model
mods = [m for n, m in model.named_modules() if isinstance(m, Int4Linear) and n.split(".")[-1] != "lm_head"]
kept = {id(m): m.dense_weight for m in mods}
if all(v is None for v in kept.values()):
    keep_dense_copies(model, dtype=torch.bfloat16)
    kept = {id(m): m.dense_weight for m in mods}
def variant(dense: bool):
    for m in mods:
        m.dense_weight = kept[id(m)] if dense else None
    cpu_decode._ALLOWED.clear(); cpu_decode._STACK.clear()
tok = p.engine.tokenizer
long = filler_ids(tok, 1024)
def ttft(ids):
    g = p.generate(ids, 1)
    return g.ttft_s * 1e3
def batch(b):
    pr = batch_prompts(tok, b, 32)
    return lambda: p.generate_batch(pr, 128).rate
cases = {"prefill 1k TTFT ms": lambda: ttft(long), "B=1 tok/s": batch(1), "B=8 tok/s": batch(8), "B=16 tok/s": batch(16)}
res = {(c, v): [] for c in cases for v in ("dense", "int4")}
for v in ("dense", "int4"):
    variant(v == "dense")
    for c, f in cases.items(): f()
for r in range(rounds):
    for v in (("dense", "int4") if r % 2 == 0 else ("int4", "dense")):
        variant(v == "dense")
        for c, f in cases.items():
            res[(c, v)].append(f())
    print(f"round {r + 1}: " + "; ".join(f"{c} {v} {res[(c, v)][-1]:.1f}" for c in cases for v in ("dense", "int4")), flush=True)
for c in cases:
    d, i = stt.median(res[(c, "dense")]), stt.median(res[(c, "int4")])
    print(f"{c}: dense {d:.1f} int4 {i:.1f} ({min(res[(c, 'int4')]):.1f}-{max(res[(c, 'int4')]):.1f})", flush=True)
p.close()
