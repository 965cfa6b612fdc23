"""Where the GPU waits in a bf16 1k-token prefill on the 8B shape: one prefill under the torch profiler (Python
stacks on), its trace saved (gzip) and read back -- the GPU's busy time, and its idle gaps over 15 us with the
host's innermost Python frames and runtime calls running during each. Also whether F.rms_norm on bf16 input
equals F.rms_norm on its float32 copy rounded to bf16 (RMSNorm's steps could then skip two copies)."""
import collections
import gzip
import json
import os
import shutil
import sys
import threading
import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile
from augury.engine.engine import Engine
from augury.engine.types import SamplingParams

OUT = os.environ.get("OUT", "/tmp")
SHAPE, DEV = (sys.argv[1:] + ["llama3-8b", "cuda"])[:2]
g = torch.Generator().manual_seed(0)
for T, D in ((1, 4096), (7, 4096), (1024, 4096), (1024, 576), (300, 640), (64, 2048)):
    for scale in (1.0, 30.0, 1e-3):
        x = (torch.randn(T, D, generator=g) * scale).to(torch.bfloat16).to(DEV)
        a = F.rms_norm(x, (D,), None, 1e-5)
        b = F.rms_norm(x.float(), (D,), None, 1e-5).to(torch.bfloat16)
        print(f"rms_norm bf16-in vs float-in T={T} D={D} scale={scale}: dtype {a.dtype}, "
              f"mismatches {(a != b).sum().item()} of {a.numel()}")

e = Engine.from_random(SHAPE, device=DEV, dtype="bfloat16", weights="native", progress=False, max_num_seqs=64,
                       max_num_batched_tokens=4096, kv_budget="24GiB" if DEV == "cuda" else "1GiB",
                       max_model_len=4096, enable_prefix_caching=False)
V = e.model_config.vocab_size
sp = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
for _ in range(3):
    Engine.collect(e.submit(torch.randint(0, V, (1024,), generator=g).tolist(), sp))
# the profiler runs inside the engine's own thread (a profiler started here would not see that thread's
# ops): EngineCore.step of the next prefill runs under it
from augury.engine.core import EngineCore

box = {}
orig_step = EngineCore.step


def traced_step(self):
    if "want" not in box:
        return orig_step(self)
    del box["want"]
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], with_stack=True) as p:
        orig_step(self)
        if DEV == "cuda":
            torch.cuda.synchronize()
    box["prof"] = p
    box["done"].set()


EngineCore.step = traced_step
box["want"], box["done"] = True, threading.Event()
Engine.collect(e.submit(torch.randint(0, V, (1024,), generator=g).tolist(), sp))
box["done"].wait(60)  # the step returns its token before its profiler closes
prof = box["prof"]
path = "/tmp/prefill_trace.json"
prof.export_chrome_trace(path)
with open(path, "rb") as f, gzip.open(os.path.join(OUT, "prefill_trace.json.gz"), "wb") as z:
    shutil.copyfileobj(f, z)
ev = json.load(open(path))["traceEvents"]
KCATS = ("kernel", "gpu_memcpy", "gpu_memset") if DEV == "cuda" else ("cpu_op",)  # CPU: a dry run of the parsing
kern = sorted((x for x in ev if x.get("ph") == "X" and x.get("cat") in KCATS),
              key=lambda x: x["ts"])
host = [x for x in ev if x.get("ph") == "X" and x.get("cat") in ("python_function", "cuda_runtime", "cpu_op")]
t0, t1 = kern[0]["ts"], max(k["ts"] + k["dur"] for k in kern)
busy = sum(k["dur"] for k in kern)
print(f"GPU: first kernel to last end {(t1 - t0) / 1e3:.2f} ms, kernels {busy / 1e3:.2f} ms, {len(kern)} ops")
allh = [x for x in ev if x.get("ph") == "X" and x.get("cat") in ("python_function", "cpu_op", "cuda_runtime")]
hs = min(x["ts"] for x in allh)
print(f"host: first event to first kernel {(t0 - hs) / 1e3:.2f} ms; last kernel end to last host event "
      f"{(max(x['ts'] + x['dur'] for x in allh) - t1) / 1e3:.2f} ms")
gaps = []
end = kern[0]["ts"] + kern[0]["dur"]
for k in kern[1:]:
    if k["ts"] - end > 15:
        gaps.append((end, k["ts"], k["name"]))
    end = max(end, k["ts"] + k["dur"])
print(f"gaps over 15 us: {len(gaps)}, {sum(b - a for a, b, _ in gaps) / 1e3:.2f} ms")
def covering(a, b):
    """Host events covering at least half of the gap [a, b], innermost (shortest) first."""
    return sorted((x for x in host if x["ts"] <= a + (b - a) / 2 and x["ts"] + x["dur"] >= a + (b - a) / 2
                   and min(x["ts"] + x["dur"], b) - max(x["ts"], a) >= (b - a) / 2), key=lambda x: x["dur"])


by = collections.Counter()
for a, b, nxt in gaps:
    by[" <- ".join(x["name"][:60] for x in covering(a, b)[:2])] += b - a
for a, b, nxt in sorted(gaps, key=lambda g: g[0] - g[1])[:14]:
    print(f"  gap {(b - a):7.1f} us at +{(a - t0) / 1e3:6.2f} ms before {nxt[:40]}: "
          + " <- ".join(x["name"][:60] for x in covering(a, b)[:5]))
print("gap time by the innermost host frames covering it:")
for k, v in by.most_common(14):
    print(f"  {v:8.1f} us  {k}")
