import sys, time, torch
from augury.bench.peers.augury_peer import AuguryPeer
from augury.bench.prompts import batch_prompts
from augury.engine.types import SamplingParams


def load(B):
    """SmolLM2 int4 on 2 threads with B 32-token prompts, warmed up once (docs/data/cpu43/bloop.py uses it too)."""
    torch.set_num_threads(2)
    p = AuguryPeer.load("smollm2", device="cpu", dtype="auto", weights="int4", threads=2, max_num_seqs=max(8, B))
    prompts = batch_prompts(p.engine.tokenizer, B, 32)
    p.generate_batch(prompts, 16)
    return p, prompts


if __name__ == "__main__":
    B = int(sys.argv[1]); N = int(sys.argv[2]) if len(sys.argv) > 2 else 4
    p, prompts = load(B)
    for rep in range(N):
        t0 = time.perf_counter()
        hs = [p.engine.submit(list(q), SamplingParams(max_tokens=512, temperature=0.0, ignore_eos=True, speculative=False)) for q in prompts]
        n = 0; first = None
        for h in hs:
            for out in h:
                if first is None and out.token_ids: first = time.perf_counter() - t0
                n += len(out.token_ids)
        tot = time.perf_counter() - t0
        print(f"B={B} agg {n/tot:.0f} decode-only {(n-B)/(tot-first):.0f}", flush=True)
    p.close()
