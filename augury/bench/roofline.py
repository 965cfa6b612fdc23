"""GPU roofline benchmark: augury against the physical limits measured in the same run.

    python -m augury.bench.roofline --out DIR [--shape llama3-8b] [--quick]

Measures HBM read bandwidth and the bf16 matmul rate, then through the engine
(random weights of the named shape, token ids only): decode at B=1 (bf16 and
int4 weight-only), aggregate decode at B=64, prefill of a 1k-token prompt, and
a SmolLM2-shaped model at B=1 with the per-step host time. Prints a table and
writes roofline.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time

import torch

from augury.bench.machine import device_read_bandwidth as read_bandwidth, measure_bandwidth
from augury.engine.engine import Engine
from augury.engine.types import SamplingParams


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def read_bandwidth_quick(device: torch.device, gib: float = 4.0) -> float:
    """The earlier reading (best of 10 bf16 sums timed from the host, no warm-up), kept to compare with
    `read_bandwidth` (`machine.device_read_bandwidth`): right after start-up it read up to 6% low."""
    return measure_bandwidth(device, int(gib * 2**30), 10, torch.bfloat16)


def matmul_rate(device: torch.device, n: int = 8192) -> float:
    a = torch.randn(n, n, dtype=torch.bfloat16, device=device)
    b = torch.randn(n, n, dtype=torch.bfloat16, device=device)
    a @ b
    _sync()
    ts = []
    for _ in range(10):
        t = time.perf_counter()
        a @ b
        _sync()
        ts.append(time.perf_counter() - t)
    return 2 * n**3 / min(ts)


def weight_bytes(engine: Engine) -> int:
    """Bytes a decode step must read: every parameter/buffer except the embedding table."""
    m = engine.loaded.model
    emb = m.embed_tokens.weight
    total = 0
    seen = set()
    # derived copies (Int4Linear.gemv_packed / gemv_scales: the weight and scales again, in the GEMV's
    # order) replace their originals' reads rather than add to them: the weights' bytes are counted once
    derived = {b.data_ptr() for n, b in m.named_buffers()
               if n.endswith(("gemv_packed", "gemv_scales", "native_scales"))}
    for t in list(m.parameters()) + list(m.buffers()):
        if t.data_ptr() in seen or t is emb or t.data_ptr() in derived:
            continue
        seen.add(t.data_ptr())
        total += t.numel() * t.element_size()
    if getattr(m.lm_head, "weight", None) is emb:  # tied head reads the embedding table once
        total += emb.numel() * emb.element_size()
    for name, b in m.named_buffers():
        if "rope" in name or "cos" in name or "sin" in name:
            total -= b.numel() * b.element_size()
    return total


def timed_decode(engine: Engine, prompts: list[list[int]], sp: SamplingParams) -> tuple[int, float, list]:
    """Submit all prompts, wait for each one's first token (prefill done), then time the
    rest: -> (tokens decoded after the first ones, seconds, first deltas)."""
    its = [iter(engine.submit(p, sp)) for p in prompts]
    firsts = [next(it) for it in its]
    t0 = time.perf_counter()
    n = sum(len(out.token_ids) for it in its for out in it)
    return n, time.perf_counter() - t0, firsts


@contextlib.contextmanager
def bursts(engine: Engine, n: int, batch: int):
    """Within: decode bursts of up to n steps (0 = off), allowed at `batch` requests even past
    engine/burst.py's MAX_BURST_BATCH."""
    from augury.engine import burst as burst_mod

    saved, cap = engine.core.burst, burst_mod.MAX_BURST_BATCH
    engine.core.burst = n
    burst_mod.MAX_BURST_BATCH = max(cap, batch) if n else cap
    try:
        yield
    finally:
        engine.core.burst, burst_mod.MAX_BURST_BATCH = saved, cap


def decode_rate(engine: Engine, batch: int, prompt_len: int, new_tokens: int, reps: int,
                burst: int | None = None) -> dict:
    """Aggregate greedy decode tok/s; `burst` overrides the engine's decode-burst length
    (0 = one step per engine iteration) for this measurement."""
    if burst is not None:
        with bursts(engine, burst, batch):
            return decode_rate(engine, batch, prompt_len, new_tokens, reps)
    g = torch.Generator().manual_seed(0)
    V = engine.model_config.vocab_size
    sp = SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True)
    rates = []
    for r in range(reps + 1):
        prompts = [torch.randint(0, V, (prompt_len,), generator=g).tolist() for _ in range(batch)]
        n, dt, _ = timed_decode(engine, prompts, sp)
        if r:  # rep 0 warms up
            rates.append(n / dt)
    return {"batch": batch, "agg_tok_s": statistics.median(rates), "min": min(rates), "max": max(rates),
            "per_request_tok_s": statistics.median(rates) / batch}


def prefill_rate(engine: Engine, prompt_len: int, reps: int) -> float:
    V = engine.model_config.vocab_size
    g = torch.Generator().manual_seed(1)
    sp = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    ts = []
    for r in range(reps + 1):
        p = torch.randint(0, V, (prompt_len,), generator=g).tolist()
        t = time.perf_counter()
        Engine.collect(engine.submit(p, sp))
        if r:
            ts.append(time.perf_counter() - t)
    return prompt_len / statistics.median(ts)


def host_step_ms(engine: Engine, steps: int = 64) -> float:
    """Median host time of one B=1 decode forward (CPU time to issue it, no sync)."""
    from augury.layers.attention import SeqSpec, build_attention_metadata

    bm = engine.blocks
    bm.admit("__host__", list(range(128)), 1 << 20)
    tab = bm.block_tables("__host__")
    ts = []
    with torch.inference_mode():
        # made inside inference mode, as the engine's own inputs are: a plain tensor would differ from
        # them in its dispatch keys, and a compiled forward would recompile for it
        x = torch.tensor([1], device=engine.loaded.device)
        for i in range(steps):
            meta = build_attention_metadata([SeqSpec(100 + i % 20, 1, tab)], bm.block_size, engine.runner.windows,
                                            engine.loaded.device)
            _sync()
            t = time.perf_counter()
            h = engine.loaded.model(x, meta.positions, meta, engine.pool)
            engine.loaded.model.compute_logits(h)
            ts.append(time.perf_counter() - t)
            _sync()
    bm.free("__host__")
    return statistics.median(ts[8:]) * 1e3


def profile_decode(engine: Engine, batch: int, prompt_len: int = 1024, steps: int = 16, top: int = 30) -> dict:
    """Kernels of about `steps` plain decode steps at exactly `batch` rows (no bursts; CUDA
    graph replays are recorded kernel by kernel): per kernel name, launches and GPU µs per
    step, longest first. Every prefill is done before the profiler starts, and max_tokens
    leaves room so that no request finishes inside the window. Steps are counted from the
    greedy sampler's argmax launches (one per step), not from the engine's counter alone, since
    the engine thread keeps stepping while this one starts and stops the profiler. The wall time per
    step includes the profiler's own overhead."""
    from torch.profiler import ProfilerActivity, profile

    cuda = engine.loaded.device.type == "cuda"  # elsewhere: CPU ops of this thread (a smoke test only)
    g = torch.Generator().manual_seed(2)
    V = engine.model_config.vocab_size
    sp = SamplingParams(max_tokens=3 * steps + 64, temperature=0.0, ignore_eos=True)
    saved = engine.core.burst
    engine.core.burst = 0
    handles = [engine.submit(torch.randint(0, V, (prompt_len,), generator=g).tolist(), sp) for _ in range(batch)]
    its = [iter(h) for h in handles]
    try:
        for it in its:
            next(it)
        t0 = time.perf_counter()
        with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
            # engine steps, not tokens read: while later prompts prefill, request 0 already decodes,
            # so tokens wait in its queue and reading them would end the window before any step ran
            s0 = engine.core.counters.steps
            while (got := engine.core.counters.steps - s0) < steps:
                time.sleep(0.0005)
            _sync()
        wall = time.perf_counter() - t0
    finally:
        engine.core.burst = saved
        for h in handles:
            h.cancel()
        for it in its:
            for _ in it:
                pass
    per: dict[str, list[float]] = {}
    for ev in prof.events():
        if ev.device_type == (torch.autograd.DeviceType.CUDA if cuda else torch.autograd.DeviceType.CPU):
            per.setdefault(ev.name, []).append(ev.time_range.elapsed_us())
    argmax = sum(len(v) for k, v in per.items() if "ArgMax" in k or k == "aten::argmax")
    n_steps = argmax or got
    kernels = sorted(({"name": k[:120], "launches_per_step": len(v) / n_steps, "us_per_step": sum(v) / n_steps}
                      for k, v in per.items()), key=lambda r: -r["us_per_step"])
    return {"batch": batch, "steps": n_steps, "steps_from": "argmax launches" if argmax else "tokens read",
            "wall_ms_per_step": wall / max(got, 1) * 1e3,
            "gpu_us_per_step": sum(r["us_per_step"] for r in kernels),
            "launches_per_step": sum(r["launches_per_step"] for r in kernels),
            "layers": engine.model_config.num_layers, "kernels": kernels[:top]}


def step_timeline(engine: Engine, batch: int, prompt_len: int = 1024, steps: int = 32,
                  burst: int = 0) -> dict:
    """Host time against GPU time of decode steps at exactly `batch` rows, without a profiler:
    the CUDA-graph decoder records the host clock at each call's entry and at its replay, and
    device events around the replay (engine/cuda_graphs.py `timing`). Per step: the wall time
    between calls, the GPU time of the replay, and the rest, the time the GPU waits for the host
    (schedule, metadata, the static-buffer refill, sampling, emitting tokens). `burst` > 0
    measures decode bursts of that many steps at this batch instead of single steps."""
    graphs = engine.runner.graphs
    if graphs is None:
        return {"batch": batch, "error": "no CUDA graphs"}
    g = torch.Generator().manual_seed(3)
    V = engine.model_config.vocab_size
    sp = SamplingParams(max_tokens=2 * steps + 64, temperature=0.0, ignore_eos=True)
    with bursts(engine, burst, batch):
        handles = [engine.submit(torch.randint(0, V, (prompt_len,), generator=g).tolist(), sp)
                   for _ in range(batch)]
        its = [iter(h) for h in handles]
        try:
            for it in its:
                next(it)
            graphs.timing = []
            s0 = engine.core.counters.steps  # engine steps, not tokens read (see profile_decode)
            while engine.core.counters.steps - s0 < steps + 2 * max(burst, 1):
                time.sleep(0.0005)
            rec, graphs.timing = graphs.timing, None
        finally:
            for h in handles:
                h.cancel()
            for it in its:
                for _ in it:
                    pass
    rec = rec[1:]  # the first call may have begun before the window
    if len(rec) < 3:
        return {"batch": batch, "error": f"{len(rec)} graph calls recorded"}
    rec[-1][3].synchronize()
    body = rec[:-1]  # each call's wall time runs to the next call's entry
    n = sum(r[4] for r in body)
    wall = rec[-1][0] - rec[0][0]
    gpu = sum(r[2].elapsed_time(r[3]) for r in body) / 1e3
    prep = [r[1] - r[0] for r in body]
    return {"batch": batch, "burst": burst, "steps": n, "calls": len(body),
            "wall_ms_per_step": wall / n * 1e3, "gpu_ms_per_step": gpu / n * 1e3,
            "gpu_idle_ms_per_step": (wall - gpu) / n * 1e3,
            "prep_ms_per_call": statistics.median(prep) * 1e3}


def hf_decode_rate(shape: str, device: torch.device, batch: int = 1, new_tokens: int = 128) -> float | None:
    """HF transformers `generate` on the same random-weight shape (the peer), tok/s aggregate."""
    try:
        import transformers
    except ImportError:
        return None
    from augury.engine.random_model import SHAPES

    d = dict(SHAPES[shape])
    mt = d.pop("model_type")
    cfg = transformers.AutoConfig.for_model(mt, **d)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).to(device).eval()
    ids = torch.randint(0, cfg.vocab_size, (batch, 256), device=device)
    kw = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        model.generate(ids, max_new_tokens=8, do_sample=False, pad_token_id=0)
        _sync()
        t = time.perf_counter()
        model.generate(ids, **kw)
        _sync()
        dt = time.perf_counter() - t
    del model
    return batch * new_tokens / dt


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m augury.bench.roofline")
    ap.add_argument("--shape", default="llama3-8b")
    ap.add_argument("--out", default=os.environ.get("OUT", "bench_out"))
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--kv-budget", default="24GiB")
    ap.add_argument("--only-small", action="store_true", help="only the SmolLM2-shaped rows (and the HF peer)")
    ap.add_argument("--compile", action="store_true", help="torch.compile the forward (inside the CUDA graphs)")
    ap.add_argument("--weights", default="native,int4", help="comma list of the 8B-shape weight kinds to run")
    ap.add_argument("--skip-small", action="store_true", help="skip the SmolLM2-shaped rows and the HF peer")
    ap.add_argument("--profile", action="store_true",
                    help="also record the kernel list of B=1 and B=64 decode steps (B=64: native weights)")
    ap.add_argument("--cases", default="b1,b64,prefill,host",
                    help="comma list of the 8B-shape measurements: b1, b64, prefill, host (host time of an eager step)")
    ap.add_argument("--timeline", action="store_true",
                    help="also record host vs GPU time per decode step (CUDA-graph replays) at the chosen batches")
    ap.add_argument("--b64-burst", type=int, default=0,
                    help="also measure B=64 with decode bursts of this many steps (past burst.py's batch cap)")
    ap.add_argument("--b1-burst", type=int, default=None,
                    help="B=1: decode bursts of this many steps instead of the engine's default (8 on CUDA graphs)")
    ap.add_argument("--revision", default="", help="the source revision to record in the JSON")
    a = ap.parse_args(argv)
    os.makedirs(a.out, exist_ok=True)

    def save() -> None:  # after every row: a run cut short still leaves what it measured
        with open(os.path.join(a.out, "roofline.json"), "w") as f:
            json.dump(res, f, indent=1)

    dev = torch.device(a.device)
    reps = 2 if a.quick else 3
    res: dict = {"device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
                 "torch": torch.__version__, "compile": a.compile, "revision": a.revision,
                 "argv": sys.argv[1:] if argv is None else list(argv)}
    bw_quick = read_bandwidth_quick(dev)  # first: the GPU's clocks as the old reading found them
    bw = read_bandwidth(dev)
    mm = matmul_rate(dev)
    res["read_bandwidth_GBps"] = bw / 1e9
    res["read_bandwidth_quick_GBps"] = bw_quick / 1e9
    res["bf16_matmul_TFLOPs"] = mm / 1e12
    print(f"read bandwidth {bw / 1e9:.0f} GB/s, bf16 matmul {mm / 1e12:.0f} TFLOP/s", file=sys.stderr, flush=True)

    rows = res["rows"] = []
    cases = set(a.cases.split(","))
    for weights in (() if a.only_small else [w for w in a.weights.split(",") if w]):
        e = Engine.from_random(a.shape, device=a.device, dtype="bfloat16", weights=weights, progress=False,
                               max_num_seqs=64, max_num_batched_tokens=4096, kv_budget=a.kv_budget,
                               max_model_len=4096, compile=a.compile)
        wb = weight_bytes(e)
        limit = bw / wb
        if "b1" in cases:
            d1 = decode_rate(e, 1, 1024, 128, reps, burst=a.b1_burst)
            d1n = decode_rate(e, 1, 1024, 128, reps, burst=0)
            rows.append({"case": f"{a.shape} {weights} decode B=1", "tok_s": d1["agg_tok_s"], "limit_tok_s": limit,
                         "fraction": d1["agg_tok_s"] / limit, "weight_GB": wb / 1e9,
                         "tok_s_no_burst": d1n["agg_tok_s"],
                         "burst": e.core.burst if a.b1_burst is None else a.b1_burst})
            print(rows[-1], file=sys.stderr, flush=True)
            save()
        if weights == "native" and "b64" in cases:
            d64 = decode_rate(e, 64, 1024, 64, max(1, reps - 1))
            d64n = decode_rate(e, 64, 1024, 64, max(1, reps - 1), burst=0)
            kv_per_tok = 2 * e.model_config.num_layers * e.model_config.num_kv_heads * e.model_config.head_dim * 2
            step_bytes = wb + 64 * (1024 + 32) * kv_per_tok
            limit64 = bw / step_bytes * 64
            rows.append({"case": f"{a.shape} bf16 decode B=64 aggregate", "tok_s": d64["agg_tok_s"],
                         "limit_tok_s": limit64, "fraction": d64["agg_tok_s"] / limit64,
                         "tok_s_no_burst": d64n["agg_tok_s"], "reps": [d64["min"], d64["max"]]})
            if a.b64_burst:
                d64b = decode_rate(e, 64, 1024, 64, max(1, reps - 1), burst=a.b64_burst)
                rows[-1][f"tok_s_burst_{a.b64_burst}"] = d64b["agg_tok_s"]
                rows[-1][f"fraction_burst_{a.b64_burst}"] = d64b["agg_tok_s"] / limit64
            print(rows[-1], file=sys.stderr, flush=True)
            save()
        if weights == "native" and "prefill" in cases:
            pf = prefill_rate(e, 1024, reps)
            n_params = sum(p.numel() for p in e.loaded.model.parameters()) - e.loaded.model.embed_tokens.weight.numel()
            flops = 2 * n_params * pf
            rows.append({"case": f"{a.shape} bf16 prefill 1k", "tok_s": pf, "TFLOPs": flops / 1e12,
                         "fraction": flops / mm})
            print(rows[-1], file=sys.stderr, flush=True)
            save()
        if weights == "native" and "host" in cases:
            res["host_step_ms_8b"] = host_step_ms(e)
        batches = [b for b, c in ((1, "b1"), (64, "b64")) if c in cases and (b == 1 or weights == "native")]
        if a.timeline:
            tl = res.setdefault("timeline", [])
            for b in batches:
                for n in sorted({0, e.core.burst, a.b64_burst if b == 64 else 0}):
                    tl.append({"weights": weights, **step_timeline(e, b, burst=n)})
                    print("timeline", tl[-1], file=sys.stderr, flush=True)
            save()
        if a.profile:
            prof = res.setdefault("profile", [])
            for b in batches:
                p = {"weights": weights, **profile_decode(e, b)}
                prof.append(p)
                print(f"profile {weights} B={p['batch']}: {p['wall_ms_per_step']:.2f} ms/step wall, "
                      f"{p['gpu_us_per_step'] / 1e3:.2f} ms GPU, {p['launches_per_step']:.0f} kernels/step",
                      file=sys.stderr, flush=True)
                for k in p["kernels"][:14]:
                    print(f"  {k['us_per_step']:9.1f} us {k['launches_per_step']:6.1f}x  {k['name'][:90]}",
                          file=sys.stderr, flush=True)
            save()
        e.shutdown()
        del e
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    if a.skip_small:
        return _report(res)
    s = Engine.from_random("smollm2-135m", device=a.device, dtype="bfloat16", progress=False, kv_budget=a.kv_budget,
                           compile=a.compile)
    d = decode_rate(s, 1, 256, 128, reps)
    dn = decode_rate(s, 1, 256, 128, reps, burst=0)
    wb = weight_bytes(s)
    host = host_step_ms(s)
    hf1 = hf_decode_rate("smollm2-135m", dev) if dev.type == "cuda" else None
    rows.append({"case": "smollm2-135m bf16 decode B=1", "tok_s": d["agg_tok_s"], "limit_tok_s": bw / wb,
                 "fraction": d["agg_tok_s"] / (bw / wb), "host_step_ms": host, "hf_tok_s": hf1,
                 "tok_s_no_burst": dn["agg_tok_s"]})
    print(rows[-1], file=sys.stderr, flush=True)
    d16 = decode_rate(s, 16, 256, 128, reps)
    d16n = decode_rate(s, 16, 256, 128, reps, burst=0)
    hf16 = hf_decode_rate("smollm2-135m", dev, batch=16) if dev.type == "cuda" else None
    rows.append({"case": "smollm2-135m bf16 decode B=16 aggregate", "tok_s": d16["agg_tok_s"],
                 "fraction": float("nan"), "hf_tok_s": hf16, "tok_s_no_burst": d16n["agg_tok_s"]})
    print(rows[-1], file=sys.stderr, flush=True)
    s.shutdown()
    save()
    return _report(res)


def _report(res: dict) -> int:
    print(f"{'case':<40} {'tok/s':>10} {'no burst':>10} {'limit':>10} {'fraction':>9}")
    for r in res["rows"]:
        print(f"{r['case']:<40} {r['tok_s']:>10.1f} {r.get('tok_s_no_burst', float('nan')):>10.1f} "
              f"{r.get('limit_tok_s', float('nan')):>10.1f} {r['fraction']:>9.2%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
