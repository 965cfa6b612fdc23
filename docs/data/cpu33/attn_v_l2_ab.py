# thirty-third session: A/B of asking pass 1 for the V rows of the keys it scores (L2 hint) on the AVX2 attention
# path; not committed (no gain). The experiment build's change, in heads_avx2's pass-1 key loop of attention.cpp:
#   static const bool xv = augury_cpu::env_switch_on("AUGURY_ATTN_XV");   // before the loop
#   if (xv) prefetch_slots<true>(vb, slots, j0, std::min(L, j0 + 8), slot_bytes, span);   // after the K prefetch
# Run alternating processes: AUGURY_ATTN_XV=0|1 python attn_v_l2_ab.py (its output: raw in benchmarks.md).
import os, statistics as st, torch
from augury.bench.peers.augury_peer import AuguryPeer
from augury.bench.prompts import batch_prompts
torch.set_num_threads(2)
p = AuguryPeer.load("smollm2", device="cpu", dtype="auto", weights="int4", threads=2, max_num_seqs=8)
pr = {b: batch_prompts(p.engine.tokenizer, b, 32) for b in (1, 8)}
for b in (1, 8): p.generate_batch(pr[b], 16)
r = {1: [], 8: []}
for i in range(3):
    for b in (1, 8): r[b].append(p.generate_batch(pr[b], 128).rate)
print(os.environ.get("AUGURY_ATTN_XV"), "B1", round(st.median(r[1])), "B8", round(st.median(r[8])), [round(x) for x in r[8]], flush=True)
p.close()
