"""Where a bf16 1k-token prefill's time goes on the 8B shape (the roofline bench's engine): the prefill rate over
6 repetitions, then one prefill under the torch profiler: wall time, the GPU kernels' summed time, the top kernels."""
import statistics
import time
import torch
from torch.profiler import ProfilerActivity, profile
from augury.bench.roofline import matmul_rate
from augury.engine.engine import Engine
from augury.engine.types import SamplingParams
import sys

SHAPE, DEV = (sys.argv[1:] + ["llama3-8b", "cuda"])[:2]
dev = torch.device(DEV)
mm = matmul_rate(dev, 1024 if dev.type == "cpu" else 8192)
e = Engine.from_random(SHAPE, device=DEV, dtype="bfloat16", weights="native", progress=False, max_num_seqs=64,
                       max_num_batched_tokens=4096, kv_budget="24GiB" if dev.type == "cuda" else "1GiB",
                       max_model_len=4096)
n_params = sum(p.numel() for p in e.loaded.model.parameters()) - e.loaded.model.embed_tokens.weight.numel()
V = e.model_config.vocab_size
g = torch.Generator().manual_seed(1)
sp = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)


def one() -> float:
    p = torch.randint(0, V, (1024,), generator=g).tolist()
    t = time.perf_counter()
    Engine.collect(e.submit(p, sp))
    return time.perf_counter() - t


one()
ts = [one() for _ in range(6)]
print("prefill 1k s:", [round(t * 1e3, 2) for t in ts], "median ms", round(statistics.median(ts) * 1e3, 2),
      "fraction", round(2 * n_params * 1024 / statistics.median(ts) / mm, 4), f"(matmul {mm / 1e12:.0f} TFLOP/s)")
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    w = one()
    if dev.type == "cuda":
        torch.cuda.synchronize()
ev = [x for x in prof.key_averages() if x.device_type == torch.autograd.DeviceType.CUDA]
tot = sum(x.self_device_time_total for x in ev)
print(f"profiled prefill wall {w * 1e3:.2f} ms, GPU kernels summed {tot / 1e3:.2f} ms")
for x in sorted(ev, key=lambda x: -x.self_device_time_total)[:18]:
    print(f"{x.self_device_time_total / 1e3:8.2f} ms {x.count:5d}x  {x.key[:110]}")
cpu = sorted((x for x in prof.key_averages() if x.device_type == torch.autograd.DeviceType.CPU),
             key=lambda x: -x.self_cpu_time_total)[:12]
print(f"host: top ops by self CPU time (of {w * 1e3:.2f} ms wall)")
for x in cpu:
    print(f"{x.self_cpu_time_total / 1e3:8.2f} ms {x.count:5d}x  {x.key[:110]}")
