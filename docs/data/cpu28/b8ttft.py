import sys, time, torch, threading
from augury.bench.peers.augury_peer import AuguryPeer
from augury.bench.prompts import batch_prompts
from augury.engine.types import SamplingParams
torch.set_num_threads(2)
B = int(sys.argv[1])
p = AuguryPeer.load("smollm2", device="cpu", dtype="auto", weights="int4", threads=2, max_num_seqs=max(8, B))
prompts = batch_prompts(p.engine.tokenizer, B, 32)
p.generate_batch(prompts, 16)
for rep in range(4):
    t0 = time.perf_counter()
    hs = [p.engine.submit(list(q), SamplingParams(max_tokens=128, temperature=0.0, ignore_eos=True, speculative=False)) for q in prompts]
    firsts = []; n = 0
    for h in hs:
        first = None
        for out in h:
            if first is None and out.token_ids: first = time.perf_counter() - t0
            n += len(out.token_ids)
        firsts.append(first)
    tot = time.perf_counter() - t0
    print(f"B={B} total {tot*1e3:.0f} ms, agg {n/tot:.0f} tok/s, first-token max {firsts[0]*1e3:.0f} ms, decode-only {(n-B)/(tot-firsts[0]):.0f} tok/s", flush=True)
p.close()
