import sys, time, torch, statistics as stt, os
from augury.bench.peers.augury_peer import AuguryPeer
from augury.bench.prompts import filler_ids
torch.set_num_threads(2)
p = AuguryPeer.load("smollm2", device="cpu", dtype="auto", weights="int4", threads=2, max_num_seqs=8)
ids = {n: filler_ids(p.engine.tokenizer, n) for n in (1024, 4096)}
for n in ids: p.generate(ids[n], 1)
r = {(v, n): [] for v in "01" for n in ids}
for i in range(int(sys.argv[1])):
    for v in ("01" if i % 2 == 0 else "10"):
        os.environ["AUGURY_INT4_PF"] = v
        for n in ids: r[(v, n)].append(n / p.generate(ids[n], 1).ttft_s)
for n in ids: print(f"prefill {n}: pf0 {stt.median(r[('0', n)]):.0f} pf1 {stt.median(r[('1', n)]):.0f} tok/s", flush=True)
p.close()
