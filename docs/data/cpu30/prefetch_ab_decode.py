import sys, time, torch, statistics as stt, os
from augury.bench.peers.augury_peer import AuguryPeer
from augury.bench.prompts import batch_prompts
torch.set_num_threads(2)
p = AuguryPeer.load("smollm2", device="cpu", dtype="auto", weights="int4", threads=2, max_num_seqs=8)
pr = {b: batch_prompts(p.engine.tokenizer, b, 32) for b in (1, 8)}
for b in (1, 8): p.generate_batch(pr[b], 16)
V = sys.argv[2].split(",")
r = {(v, b): [] for v in V for b in (1, 8)}
for i in range(int(sys.argv[1])):
    for v in (V if i % 2 == 0 else V[::-1]):
        os.environ["AUGURY_INT4_PF"] = v
        for b in (1, 8): r[(v, b)].append(p.generate_batch(pr[b], 128).rate)
for v in V:
    m1, m8 = stt.median(r[(v, 1)]), stt.median(r[(v, 8)])
    print(f"pf{v} B=1 {m1:.0f} B=8 {m8:.0f} ratio {m8/m1:.2f} paired {stt.median(a/b for a,b in zip(r[(v,8)], r[(v,1)])):.2f}", flush=True)
p.close()
