"""The many-row Triton steps (`layers/triton_rows.py`: silu * up, rope) on and off in one engine (row_ops'
switch, AUGURY_TRITON_ROWS, re-read between rounds): greedy tokens of three prompts equal; bf16 1k-token
prefill rate of each switch setting in VARIANTS, interleaved over rounds (median of 6 each); then one profiled prefill with them on."""
import os
import statistics
import sys
import time
import torch
from torch.profiler import ProfilerActivity, profile
from augury.bench.roofline import matmul_rate
from augury.engine.engine import Engine
from augury.engine.types import SamplingParams
from augury.layers import row_ops

SHAPE, DEV = (sys.argv[1:] + ["llama3-8b", "cuda"])[:2]
ROUNDS = int(os.environ.get("ROUNDS", "2"))
dev = torch.device(DEV)
mm = matmul_rate(dev, 1024 if dev.type == "cpu" else 8192)
e = Engine.from_random(SHAPE, device=DEV, dtype="bfloat16", weights="native", progress=False, max_num_seqs=64,
                       max_num_batched_tokens=4096, kv_budget="24GiB" if dev.type == "cuda" else "1GiB",
                       max_model_len=4096, enable_prefix_caching=False)  # every prefill computed
n_params = sum(p.numel() for p in e.loaded.model.parameters()) - e.loaded.model.embed_tokens.weight.numel()
V = e.model_config.vocab_size


VARIANTS = os.environ.get("VARIANTS", "0;1").split(";")  # AUGURY_TRITON_ROWS values, interleaved by round


def switch(v) -> None:
    os.environ["AUGURY_TRITON_ROWS"] = v if isinstance(v, str) else ("1" if v else "0")
    row_ops.reset()


def prompts(seed: int, n: int, length: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, V, (length,), generator=g).tolist() for _ in range(n)]


greedy = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True, logprobs=True, top_logprobs=5)
toks = {}
for on in (True, False):
    switch(on)
    rs = [Engine.collect(e.submit(p, greedy)) for p in prompts(7, 3, 700)]
    toks[on] = [(r.token_ids, repr(r.logprobs)) for r in rs]  # the log-probabilities too: the logits' bits
print("greedy tokens and top-5 logprobs equal (on vs off):", toks[True] == toks[False], toks[True][0][0])

one_tok = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)


def prefill_ms(seed: int, reps: int = 6) -> float:
    ts = []
    for p in prompts(seed, reps + 1, 1024):
        t = time.perf_counter()
        Engine.collect(e.submit(p, one_tok))
        ts.append(time.perf_counter() - t)
    return statistics.median(ts[1:]) * 1e3


res = {v: [] for v in VARIANTS}
for r in range(ROUNDS):
    for v in VARIANTS:
        switch(v)
        res[v].append(prefill_ms(100 + r))
for v in VARIANTS:
    ms = statistics.median(res[v])
    print(f"AUGURY_TRITON_ROWS={v}: prefill 1k ms per round {[round(x, 2) for x in res[v]]}; median "
          f"{1024 / ms * 1e3:,.0f} tok/s, {2 * n_params * 1024 / (ms / 1e3) / mm:.4f} of {mm / 1e12:.0f} TFLOP/s")
switch(True)
p = prompts(999, 1, 1024)[0]
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    Engine.collect(e.submit(p, one_tok))
    if dev.type == "cuda":
        torch.cuda.synchronize()
ev = [x for x in prof.key_averages() if x.device_type == torch.autograd.DeviceType.CUDA]
print(f"profiled (on): GPU kernels summed {sum(x.self_device_time_total for x in ev) / 1e3:.2f} ms")
for x in sorted(ev, key=lambda x: -x.self_device_time_total)[:14]:
    print(f"{x.self_device_time_total / 1e3:8.2f} ms {x.count:5d}x  {x.key[:110]}")
