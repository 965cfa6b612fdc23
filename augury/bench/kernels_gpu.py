"""Microbenchmark of the Triton decode kernels against the paths they would replace (8B shapes).

    python -m augury.bench.kernels_gpu --out DIR [--sweep] [--budget-s 240] [--tiny] [--only PARTS]

1. paged decode attention (augury.layers.triton_paged_decode) vs the current native path
   (index_select gather + SDPA), B in {1, 8, 64} x ctx in {1k, 8k}, plus verify widths;
2. int4 dequant-matmul (augury.layers.triton_int4) vs tinygemm (`Int4Linear`) and the bf16
   cuBLAS matmul, for the N x K of every llama3-8b linear, M in {1, 4, 16};
3. fused encoded-KV decode (augury.kv.codecs.triton_attention) at 8k, B in {1, 8}, vs the
   native kernel and the current native path, with the old and new split grids;
4. `--only attn-onelaunch` (not in the default parts): the native paged decode kernel at small
   batch (B in {1, 4} x {1k, 4k, 8k} keys), the two-launch path (older split choice + merge
   kernel) vs the one-launch path (merge by the last program, short splits), over 32 layers'
   worth of distinct pools per graph; both paths checked against each other and a float32
   reference, and the one-launch graph replayed repeatedly and compared bitwise (a
   memory-ordering slip in the in-launch merge would show up there); a few other tile / wave
   choices for the one-launch path are timed too, for retuning `plan_launch`.

Every time is the median over replays of a CUDA graph holding one call per "layer" copy
(distinct buffers totalling several times the L2), divided by the number of calls: what a
captured decode step pays, launch overhead excluded. Bandwidth figures count the bytes each
kernel must read (KV rows or packed weights + scales), against a read bandwidth measured in
the same run. --sweep also searches launch parameters (coordinate descent) and records the
best per case. Writes DIR/kernels_gpu.json (rewritten after every case).
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

import torch

from augury.bench.machine import device_read_bandwidth

L2_MULTIPLE_BYTES = 512 << 20  # each case cycles through >= this many bytes of distinct buffers
MAX_COPIES = 32
# --sweep searches these cases only (the ones the targets name), each for at most SWEEP_CASE_S
SWEEP_CASE_S = 12.0
SWEEP_ATTENTION = {(1, 8192, 16), (8, 8192, 4), (1, 1024, 1), (2, 40, 1)}
SWEEP_INT4 = {("qkv", 1), ("o", 1), ("gate_up", 1), ("down", 1), ("qkv", 16), ("gate_up", 16)}
SWEEP_ENCODED = {("turbo", 8), ("affine4", 8), ("turbo", 1), ("turbo:rk4v3", 8)}


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def copies_for(nbytes: int) -> int:
    return max(1, min(MAX_COPIES, math.ceil(L2_MULTIPLE_BYTES / max(1, nbytes))))


def time_calls(fns: list[Callable[[], object]], device: torch.device, reps: int = 15) -> float:
    """Median microseconds per call of `fns` run back to back (one CUDA graph replay per sample)."""
    for f in fns:  # compile + warm
        f()
    if device.type != "cuda":
        ts = []
        for _ in range(3):
            t = time.perf_counter()
            for f in fns:
                f()
            ts.append((time.perf_counter() - t) / len(fns) * 1e6)
        return statistics.median(ts)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for f in fns:
            f()
    torch.cuda.current_stream().wait_stream(s)
    with torch.cuda.graph(g):
        for f in fns:
            f()
    g.replay()
    torch.cuda.synchronize()
    start = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    end = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for a, b in zip(start, end):
        a.record()
        g.replay()
        b.record()
    torch.cuda.synchronize()
    del g
    return statistics.median(a.elapsed_time(b) for a, b in zip(start, end)) * 1e3 / len(fns)


def read_bandwidth(device: torch.device) -> float:
    """Bytes/s of a large bf16 reduction (`machine.device_read_bandwidth`: warmed, device-timed);
    a nominal 10 GB/s off CUDA (the interpreter's runs only check that the benchmark runs)."""
    if device.type != "cuda":
        return 1e10
    return device_read_bandwidth(device)


def coordinate_search(grid: dict[str, list], start: dict, evaluate: Callable[[dict], float],
                      deadline: float, passes: int = 2) -> tuple[dict, float, list]:
    """Minimize evaluate(params) one parameter at a time; failures (e.g. too many registers) score inf."""
    best = dict(start)
    seen: dict[tuple, float] = {}

    def score(p: dict) -> float:
        key = tuple(sorted(p.items()))
        if key not in seen:
            try:
                seen[key] = evaluate(p)
            except Exception as e:  # noqa: BLE001 - a config that does not compile is just skipped
                _log(f"  config {p} failed: {type(e).__name__}: {str(e)[:120]}")
                seen[key] = math.inf
        return seen[key]

    best_t = score(best)
    for _ in range(passes):
        improved = False
        for name, values in grid.items():
            for v in values:
                if time.perf_counter() > deadline:
                    return best, best_t, [dict(k) | {"us": t} for k, t in seen.items()]
                cand = dict(best, **{name: v})
                t = score(cand)
                if t < best_t * 0.98:
                    best, best_t, improved = cand, t, True
        if not improved:
            break
    return best, best_t, [dict(k) | {"us": t} for k, t in seen.items()]


# ---------------------------------------------------------------------------- attention


def _attention_case(B: int, ctx: int, max_q: int, H: int, Hkv: int, D: int, dev: torch.device,
                    dtype: torch.dtype, bs: int = 16, seed: int = 0):
    """Metadata for B requests with `ctx` cached tokens and max_q new ones, in shuffled blocks."""
    from augury.layers.attention import SeqSpec, build_attention_metadata

    g = torch.Generator().manual_seed(seed)
    per = -(-(ctx + max_q) // bs)
    perm = torch.randperm(B * per, generator=g).tolist()
    specs = [SeqSpec(ctx, max_q, {"full": perm[i * per:(i + 1) * per]}) for i in range(B)]
    gm = build_attention_metadata(specs, bs, {"full": None}, dev).groups["full"]
    return gm, B * per * bs


def encoded_copies(codec, n_slots: int, D: int, dtype: torch.dtype, dev: torch.device, kp: torch.Tensor,
                   vp: torch.Tensor, copies: int = 1) -> list:
    """`copies` (key store, value store) pairs of the bound `codec`, each holding kp/vp
    [n_slots, Hkv, D] encoded: the first written in chunks of 64k rows (bounded temporaries),
    the rest copied from it (same contents, distinct memory, so timed replays read past the L2)."""
    from augury.kv.codecs import EncodedStore

    Hkv = kp.shape[1]
    all_slots = torch.arange(n_slots, device=dev)
    stores: list = []
    for _ in range(copies):
        ks = EncodedStore(codec.key, n_slots, Hkv, D, dtype, dev)
        vs = EncodedStore(codec.value, n_slots, Hkv, D, dtype, dev)
        if not stores:
            for lo in range(0, n_slots, 65536):
                ks.write(all_slots[lo:lo + 65536], kp[lo:lo + 65536])
                vs.write(all_slots[lo:lo + 65536], vp[lo:lo + 65536])
        else:
            for dst, src in zip((*ks.parts, *vs.parts), (*stores[0][0].parts, *stores[0][1].parts)):
                dst.copy_(src)
        stores.append((ks, vs))
    return stores


def bench_attention(cases, H, Hkv, D, dev, bw, sweep: bool, deadline: float, res: dict, save) -> None:
    from augury.layers.attention import attend
    from augury.layers.triton_paged_decode import num_splits_for, paged_decode_attention

    dt = torch.bfloat16
    scale = D ** -0.5
    rows = res.setdefault("attention", [])
    for B, ctx, max_q in cases:
        gm, n_slots = _attention_case(B, ctx, max_q, H, Hkv, D, dev, dt)
        kv_bytes = B * gm.max_kv * Hkv * D * 2 * 2
        L = copies_for(kv_bytes)
        pools = [(torch.randn(n_slots, Hkv, D, device=dev, dtype=dt), torch.randn(n_slots, Hkv, D, device=dev, dtype=dt))
                 for _ in range(L)]
        q = torch.randn(B * max_q, H, D, device=dev, dtype=dt)
        qp = q.view(B, max_q, H, D)
        bias = gm.additive_mask(dt)

        def current(kp, vp):
            return lambda: attend(q, lambda s: kp.index_select(0, s), lambda s: vp.index_select(0, s), gm, scale, None)

        def kernel(kp, vp, **kw):
            return lambda: paged_decode_attention(qp, kp, vp, gm.gather_slots, bias, scale, None, **kw)

        cur_us = time_calls([current(kp, vp) for kp, vp in pools], dev)
        ker_us = time_calls([kernel(kp, vp) for kp, vp in pools], dev)
        ref = current(*pools[0])().view(B, max_q, H, D).float()
        got = kernel(*pools[0])().float()
        row = {"batch": B, "ctx": ctx, "max_q": max_q, "kv_bytes": kv_bytes, "copies": L,
               "current_us": cur_us, "kernel_us": ker_us, "speedup": cur_us / ker_us,
               "kernel_bw_fraction": kv_bytes / (ker_us * 1e-6) / bw,
               "current_bw_fraction": kv_bytes / (cur_us * 1e-6) / bw,
               "max_abs_diff": float((ref - got).abs().max())}
        if sweep and (B, ctx, max_q) in SWEEP_ATTENTION and time.perf_counter() < deadline:
            case_deadline = min(deadline, time.perf_counter() + SWEEP_CASE_S)

            def evaluate(p):
                S = num_splits_for(B * Hkv, gm.max_kv, p["block_n"], dev, waves=p["waves"])
                return time_calls([kernel(kp, vp, num_splits=S, block_n=p["block_n"], num_warps=p["num_warps"],
                                          num_stages=p["num_stages"]) for kp, vp in pools], dev, reps=7)
            grid = {"waves": [1, 2, 4, 8, 16], "block_n": [16, 32, 64, 128], "num_warps": [2, 4, 8],
                    "num_stages": [1, 2, 3, 4]}
            best, best_t, tried = coordinate_search(grid, {"waves": 4, "block_n": 64, "num_warps": 4, "num_stages": 3},
                                                    evaluate, case_deadline)
            row["sweep_best"] = best | {"us": best_t, "bw_fraction": kv_bytes / (best_t * 1e-6) / bw}
            row["sweep_tried"] = tried
        rows.append(row)
        _log(f"attention B={B} ctx={ctx} q={max_q}: current {cur_us:.1f} us, kernel {ker_us:.1f} us "
             f"({row['speedup']:.2f}x, {row['kernel_bw_fraction']:.0%} of bw)"
             + (f"; sweep best {row['sweep_best']}" if "sweep_best" in row else ""))
        save()
        del pools
        _free(dev)


# ---------------------------------------------------------------------------- int4


LLAMA8B_LINEARS = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336),
                   "lm_head": (128256, 4096)}


def bench_int4(shapes: dict, ms: list[int], gs: int, dev, bw, sweep: bool, deadline: float, res: dict, save) -> None:
    from augury.layers.quant_linear import Int4Linear, Int4Parts
    from augury.layers.triton_int4 import LaunchConfig, default_config, int4_linear, pack

    dt = torch.bfloat16
    rows = res.setdefault("int4", [])
    for name, (N, K) in shapes.items():
        g = torch.Generator(device="cpu").manual_seed(0)
        q = torch.randint(0, 16, (N, K), generator=g, dtype=torch.uint8)
        G = -(-K // gs)
        s = (torch.rand(N, G, generator=g) * 0.02 + 0.001).bfloat16().float()
        z = (torch.randn(N, G, generator=g) * 0.01).bfloat16().float()
        packed = pack(q.to(dev), s.to(dev), z.to(dev), gs, dtype=dt, device=dev)
        wbytes = packed.nbytes()
        L = copies_for(wbytes)
        packs = [packed] + [type(packed)(packed.qweight.clone(), packed.scale.clone(), packed.zero.clone(),
                                         N, K, gs) for _ in range(L - 1)]
        tiny = None
        if dev.type == "cuda":
            lin = Int4Linear.from_parts(Int4Parts(q, s, z, gs), device=dev)
            tiny = [lin] + [copy.deepcopy(lin) for _ in range(L - 1)]
        dense_L = copies_for(N * K * 2)
        dense = [torch.randn(N, K, device=dev, dtype=dt) * 0.02 for _ in range(min(dense_L, 4))]
        del q
        for M in ms:
            x = torch.randn(M, K, device=dev, dtype=dt)
            ours = time_calls([(lambda p=p: int4_linear(x, p)) for p in packs], dev)
            row = {"linear": name, "N": N, "K": K, "M": M, "group_size": gs, "weight_bytes": wbytes, "copies": L,
                   "kernel_us": ours, "kernel_bw_fraction": wbytes / (ours * 1e-6) / bw}
            if tiny is not None:
                tg = time_calls([(lambda m=m: m(x)) for m in tiny], dev)
                ref = tiny[0](x).float()
                got = int4_linear(x, packs[0]).float()
                row |= {"tinygemm_us": tg, "tinygemm_bw_fraction": wbytes / (tg * 1e-6) / bw,
                        "speedup_vs_tinygemm": tg / ours,
                        "max_abs_diff_vs_tinygemm": float((ref - got).abs().max()),
                        "ref_abs_max": float(ref.abs().max())}
            bf = time_calls([(lambda w=w: torch.nn.functional.linear(x, w)) for w in dense], dev)
            row |= {"bf16_us": bf, "bf16_bw_fraction": N * K * 2 / (bf * 1e-6) / bw}
            if sweep and (name, M) in SWEEP_INT4 and time.perf_counter() < deadline:
                case_deadline = min(deadline, time.perf_counter() + SWEEP_CASE_S)

                def evaluate(p):
                    cfg = LaunchConfig(p["block_n"], p["block_k"], p["num_warps"], p["num_stages"], p["waves"])
                    return time_calls([(lambda pk=pk: int4_linear(x, pk, cfg=cfg, use_dot=p["dot"])) for pk in packs],
                                      dev, reps=7)
                grid = {"block_n": [64, 128, 256], "block_k": [64, 128, 256], "waves": [2, 4, 8],
                        "num_warps": [2, 4, 8], "num_stages": [2, 3, 4, 5], "dot": [False, True] if M == 1 else [True]}
                d = default_config(N, K, M)
                start = {"block_n": d.block_n, "block_k": d.block_k, "num_warps": d.num_warps,
                         "num_stages": d.num_stages, "waves": d.waves, "dot": M > 1}
                best, best_t, tried = coordinate_search(grid, start, evaluate, case_deadline)
                row["sweep_best"] = best | {"us": best_t, "bw_fraction": wbytes / (best_t * 1e-6) / bw}
                row["sweep_tried"] = tried
            rows.append(row)
            _log(f"int4 {name} {N}x{K} M={M}: kernel {ours:.1f} us ({row['kernel_bw_fraction']:.0%} bw)"
                 + (f", tinygemm {row['tinygemm_us']:.1f} us ({row['speedup_vs_tinygemm']:.2f}x)" if tiny else "")
                 + f", bf16 {bf:.1f} us" + (f"; sweep best {row['sweep_best']}" if "sweep_best" in row else ""))
            save()
        del packs, tiny, dense
        _free(dev)


def int4_model_estimate(rows: list[dict], layers: int = 32) -> dict:
    """Per decode step (M = 1): layers x (qkv + o + gate_up + down) + lm_head, kernel vs tinygemm."""
    by = {r["linear"]: r for r in rows if r["M"] == 1}
    if not all(k in by for k in LLAMA8B_LINEARS):
        return {}
    out = {}
    for key in ("kernel_us", "tinygemm_us"):
        if all(key in by[k] for k in by):
            out[key] = layers * sum(by[k][key] for k in ("qkv", "o", "gate_up", "down")) + by["lm_head"][key]
    out["weight_bytes"] = layers * sum(by[k]["weight_bytes"] for k in ("qkv", "o", "gate_up", "down")) \
        + by["lm_head"]["weight_bytes"]
    return out


# ---------------------------------------------------------------------------- encoded KV


def bench_encoded(schemes, batches, ctx, H, Hkv, D, dev, bw, sweep: bool, deadline: float, res: dict, save) -> None:
    from augury.kv.codecs import parse_codec
    from augury.kv.codecs import triton_attention as ta
    from augury.layers.attention import attend
    from augury.layers.triton_paged_decode import paged_decode_attention

    dt = torch.bfloat16
    scale = D ** -0.5
    rows = res.setdefault("encoded", [])
    for B in batches:
        gm, n_slots = _attention_case(B, ctx, 1, H, Hkv, D, dev, dt)
        native_bytes = B * gm.max_kv * Hkv * D * 2 * 2
        L = copies_for(native_bytes)
        pools = [(torch.randn(n_slots, Hkv, D, device=dev, dtype=dt), torch.randn(n_slots, Hkv, D, device=dev, dtype=dt))
                 for _ in range(L)]
        q = torch.randn(B, H, D, device=dev, dtype=dt)
        qp = q.view(B, 1, H, D)
        bias = gm.additive_mask(dt)
        cur = time_calls([(lambda kp=kp, vp=vp: attend(q, lambda s: kp.index_select(0, s),
                                                       lambda s: vp.index_select(0, s), gm, scale, None))
                          for kp, vp in pools], dev)
        nat = time_calls([(lambda kp=kp, vp=vp: paged_decode_attention(qp, kp, vp, gm.gather_slots, bias, scale))
                          for kp, vp in pools], dev)
        row = {"batch": B, "ctx": ctx, "native_current_us": cur, "native_kernel_us": nat}
        for name in schemes:
            codec = parse_codec(name)
            codec.bind(D)
            # as many copies as native needed: encoded ones are smaller, so they exceed the L2 too
            stores = encoded_copies(codec, n_slots, D, dt, dev, *pools[0], copies=L)
            enc_bytes = sum(t.numel() * t.element_size() for t in (*stores[0][0].parts, *stores[0][1].parts)) \
                * (B * gm.max_kv) / n_slots

            def call(ks, vs, **kw):
                return lambda: ta.encoded_decode_attention(qp, ks, vs, gm.gather_slots, bias, scale, None, **kw)

            old = dict(num_splits=ta._num_splits(B * Hkv, gm.max_kv, 64, dev, waves=2, min_tiles=4), block_n=64,
                       num_warps=4, num_stages=3)
            old_us = time_calls([call(ks, vs, **old) for ks, vs in stores], dev)
            new_us = time_calls([call(ks, vs) for ks, vs in stores], dev)
            ref = attend(q, stores[0][0].read, stores[0][1].read, gm, scale, None).float()
            got = call(*stores[0])().view(B, H, D).float()
            r = {"old_grid_us": old_us, "kernel_us": new_us, "vs_native_current": cur / new_us,
                 "vs_native_kernel": nat / new_us, "old_vs_native_current": cur / old_us,
                 "encoded_bytes": enc_bytes, "bw_fraction": enc_bytes / (new_us * 1e-6) / bw,
                 "max_abs_diff_vs_eager": float((ref - got).abs().max())}
            if sweep and (name, B) in SWEEP_ENCODED and time.perf_counter() < deadline:
                case_deadline = min(deadline, time.perf_counter() + SWEEP_CASE_S)

                def evaluate(p):
                    S = ta._num_splits(B * Hkv, gm.max_kv, p["block_n"], dev, waves=p["waves"])
                    return time_calls([call(ks, vs, num_splits=S, block_n=p["block_n"], num_warps=p["num_warps"],
                                            num_stages=p["num_stages"], group_bcast=p["bcast"])
                                       for ks, vs in stores], dev, reps=7)
                grid = {"waves": [2, 4, 8, 16], "block_n": [16, 32, 64], "num_warps": [2, 4, 8],
                        "num_stages": [1, 2, 3], "bcast": [True]}
                best, best_t, tried = coordinate_search(
                    grid, {"waves": ta.SPLIT_WAVES if B * Hkv > 16 else 2.0, "block_n": ta.BLOCK_N,
                           "num_warps": ta.NUM_WARPS, "num_stages": ta.NUM_STAGES, "bcast": ta.GROUP_BCAST},
                    evaluate, case_deadline)
                r["sweep_best"] = best | {"us": best_t, "vs_native_current": cur / best_t}
                r["sweep_tried"] = tried
            row[name] = r
            _log(f"encoded {name} B={B} ctx={ctx}: old grid {old_us:.1f} us, now {new_us:.1f} us "
                 f"({cur / new_us:.2f}x native-current {cur:.1f} us, {nat / new_us:.2f}x native-kernel {nat:.1f} us)"
                 + (f"; sweep best {r['sweep_best']}" if "sweep_best" in r else ""))
            del stores
            save()
        rows.append(row)
        save()
        del pools
        _free(dev)


# ---------------------------------------------------------------------------- one-launch attention

ONELAUNCH_LAYERS = 32  # calls per graph, each over its own pools (32 layers' worth)
ONELAUNCH_VARIANTS_S = 30.0  # seconds for the extra tile / wave choices, all cases together
ONELAUNCH_REPLAYS = 20  # replays of the one-launch graph compared bitwise with an eager call


def _plan_str(cfg, S: int, B: int, Hkv: int) -> str:
    return f"{cfg.block_n}-key tiles x {S} splits, {B * Hkv * S} programs, {cfg.num_warps} warps"


def bench_onelaunch(cases, H, Hkv, D, dev, bw, res: dict, save, variants_s: float = ONELAUNCH_VARIANTS_S) -> None:
    """Two-launch (older split choice + merge kernel) vs one-launch (merge by the last program,
    short splits) paged decode attention at small batch; see the module doc (4)."""
    from augury.layers.triton_paged_decode import paged_decode_attention, plan_launch
    from augury.layers.triton_splitkv import sm_count, split_counters, split_plan, splits_for_sms

    dt = torch.bfloat16
    scale = D ** -0.5
    sms = sm_count(dev)
    rows = res.setdefault("attn_onelaunch", [])
    variants_deadline = time.perf_counter() + variants_s
    for B, ctx in cases:
        gm, n_slots = _attention_case(B, ctx, 1, H, Hkv, D, dev, dt)
        kv_bytes = B * gm.max_kv * Hkv * D * 2 * 2
        L = ONELAUNCH_LAYERS if dev.type == "cuda" else 2
        g = torch.Generator(device=dev).manual_seed(B * 100003 + ctx)
        pools = [(torch.randn(n_slots, Hkv, D, device=dev, dtype=dt, generator=g),
                  torch.randn(n_slots, Hkv, D, device=dev, dtype=dt, generator=g)) for _ in range(L)]
        qp = torch.randn(B, 1, H, D, device=dev, dtype=dt, generator=g)
        bias = gm.additive_mask(dt)
        block_m = max(16, 1 << (H // Hkv - 1).bit_length())
        block_d = max(16, 1 << (D - 1).bit_length())
        old_cfg, old_S = plan_launch(block_m, B * Hkv, gm.max_kv, block_d, sms, one_launch=False)
        new_cfg, new_S = plan_launch(block_m, B * Hkv, gm.max_kv, block_d, sms, one_launch=True)

        def call(kp, vp, **kw):
            return lambda: paged_decode_attention(qp, kp, vp, gm.gather_slots, bias, scale, None, **kw)

        def timed(**kw) -> float:
            return time_calls([call(kp, vp, **kw) for kp, vp in pools], dev)

        two_us = timed(one_launch=False)
        one_us = timed()
        # the older split choice merged in the launch: what the merge alone buys
        old_split_one_us = timed(num_splits=old_S, block_n=old_cfg.block_n, num_warps=old_cfg.num_warps)

        # agreement: both paths, and a float32 reference, on the first pool
        kp, vp = pools[0]
        two = call(kp, vp, one_launch=False)().float()
        one = call(kp, vp)().float()
        flat = gm.gather_slots.reshape(-1)
        k = kp.index_select(0, flat).view(B, -1, Hkv, D).transpose(1, 2).float().repeat_interleave(H // Hkv, 1)
        v = vp.index_select(0, flat).view(B, -1, Hkv, D).transpose(1, 2).float().repeat_interleave(H // Hkv, 1)
        att = (qp.transpose(1, 2).float() @ k.transpose(-1, -2)) * scale + bias.float()
        ref = (att.softmax(-1) @ v).transpose(1, 2)

        # determinism under graph replay (and the counters left at 0 for the next replay)
        eager = [call(kp, vp)() for kp, vp in pools]
        equal = total = 0
        if dev.type == "cuda":
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for kp, vp in pools:
                    call(kp, vp)()
            torch.cuda.current_stream().wait_stream(side)
            with torch.cuda.graph(graph):
                outs = [call(kp, vp)() for kp, vp in pools]
            for _ in range(ONELAUNCH_REPLAYS):
                for o in outs:
                    o.fill_(float("nan"))
                graph.replay()
                equal += sum(bool(torch.equal(o, e)) for o, e in zip(outs, eager))
                total += len(outs)
            torch.cuda.synchronize()
            del graph, outs
        else:
            again = [call(kp, vp)() for kp, vp in pools]
            equal, total = sum(bool(torch.equal(a, e)) for a, e in zip(again, eager)), len(eager)
        counters_zero = not bool(split_counters(dev).any())

        row = {"batch": B, "ctx": ctx, "max_kv": gm.max_kv, "kv_bytes": kv_bytes, "layers": L,
               "two_launch": {"block_n": old_cfg.block_n, "splits": old_S, "num_warps": old_cfg.num_warps,
                              "programs": B * Hkv * old_S, "us": two_us, "GBps": kv_bytes / two_us / 1e3},
               "one_launch": {"block_n": new_cfg.block_n, "splits": new_S, "num_warps": new_cfg.num_warps,
                              "programs": B * Hkv * new_S, "us": one_us, "GBps": kv_bytes / one_us / 1e3},
               "old_split_one_launch_us": old_split_one_us,
               "speedup": two_us / one_us, "one_launch_bw_fraction": kv_bytes / (one_us * 1e-6) / bw,
               "max_abs_diff_one_vs_two": float((one - two).abs().max()),
               "max_abs_diff_one_vs_fp32": float((one - ref).abs().max()),
               "max_abs_diff_two_vs_fp32": float((two - ref).abs().max()),
               "replays_bitwise_equal": f"{equal}/{total}", "counters_zero": counters_zero}

        # other tile / wave / warp / slot-prefetch choices for the one-launch path (retuning plan_launch)
        tried, seen = [], set()
        for block_n in (128, 64, 32):
            for waves in (1.0, 2.0, 4.0):
                for warps in (4, 2):
                    for prefetch in (False, True):
                        if time.perf_counter() > variants_deadline or (block_n == 32 and (waves > 2 or prefetch)):
                            continue
                        S = split_plan(gm.max_kv, splits_for_sms(B * Hkv, gm.max_kv, block_n, sms, waves, 1),
                                       block_n)[0]
                        if (block_n, S, warps, prefetch) in seen:
                            continue
                        seen.add((block_n, S, warps, prefetch))
                        try:
                            us = timed(num_splits=S, block_n=block_n, num_warps=warps, prefetch=prefetch)
                        except Exception as e:  # noqa: BLE001 - a config that does not compile is just skipped
                            _log(f"  variant {block_n}/{S}/{warps} failed: {type(e).__name__}: {str(e)[:120]}")
                            continue
                        tried.append({"block_n": block_n, "splits": S, "num_warps": warps, "prefetch": prefetch,
                                      "programs": B * Hkv * S, "us": us, "GBps": kv_bytes / us / 1e3})
        row["one_launch_variants"] = sorted(tried, key=lambda r: r["us"])
        rows.append(row)
        best = row["one_launch_variants"][0] if tried else None
        _log(f"attn-onelaunch B={B} ctx={ctx}: two-launch {two_us:.2f} us ({row['two_launch']['GBps']:.0f} GB/s; "
             f"{_plan_str(old_cfg, old_S, B, Hkv)}) | one-launch {one_us:.2f} us ({row['one_launch']['GBps']:.0f} GB/s; "
             f"{_plan_str(new_cfg, new_S, B, Hkv)}) -> {row['speedup']:.2f}x | old splits merged in launch "
             f"{old_split_one_us:.2f} us | max|one-two| {row['max_abs_diff_one_vs_two']:.3g}, max|one-fp32| "
             f"{row['max_abs_diff_one_vs_fp32']:.3g}, max|two-fp32| {row['max_abs_diff_two_vs_fp32']:.3g} | "
             f"replays bitwise equal {equal}/{total}, counters zero {counters_zero}"
             + (f" | best variant {best['block_n']}x{best['splits']} w{best['num_warps']} "
                f"prefetch {best['prefetch']} {best['us']:.2f} us"
                if best else ""))
        save()
        del pools, eager
        _free(dev)


def _free(dev: torch.device) -> None:
    import gc

    gc.collect()
    if dev.type == "cuda":
        torch.cuda.empty_cache()


def main(argv: list[str] | None = None) -> int:
    global SWEEP_CASE_S
    ap = argparse.ArgumentParser(prog="python -m augury.bench.kernels_gpu")
    ap.add_argument("--out", default=os.environ.get("OUT", "bench_out"))
    ap.add_argument("--parts", default="attention,int4,encoded",
                    help="comma-separated: attention, int4, encoded, attn-onelaunch")
    ap.add_argument("--only", default=None, help="run just these parts (comma-separated; overrides --parts)")
    ap.add_argument("--onelaunch-variants-s", type=float, default=ONELAUNCH_VARIANTS_S,
                    help="attn-onelaunch: seconds for timing other launch choices (0: none)")
    ap.add_argument("--sweep", action="store_true", help="also search launch parameters per case")
    ap.add_argument("--budget-s", type=float, default=240.0, help="stop sweeping after this many seconds")
    ap.add_argument("--sweep-parts", default="attention,int4,encoded", help="which parts --sweep searches")
    ap.add_argument("--sweep-case-s", type=float, default=SWEEP_CASE_S, help="sweep seconds per case")
    ap.add_argument("--schemes", default="turbo,turbo:rk4v3,affine4")
    ap.add_argument("--tiny", action="store_true", help="small shapes: a dry run of the script (CPU interpreter)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--revision", default="", help="the source revision to record (default: git HEAD, as git_head)")
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    deadline = t0 + a.budget_s
    dev = torch.device(a.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        _log("no CUDA device")
        return 1
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    import triton

    res: dict = {"device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
                 "torch": torch.__version__, "triton": triton.__version__, "sweep": a.sweep}
    if a.revision:
        res["revision"] = a.revision
    else:  # a copied tree may carry a stale .git (seen on the device machine): pass --revision there
        try:
            import subprocess

            res["git_head"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                             text=True).stdout.strip()
        except OSError:
            pass

    def save() -> None:
        (out / "kernels_gpu.json").write_text(json.dumps(res, indent=1))

    bw = read_bandwidth(dev)
    res["read_bandwidth_GBps"] = bw / 1e9
    _log(f"read bandwidth {bw / 1e9:.0f} GB/s")
    parts = set((a.only or a.parts).split(","))
    swept = set(a.sweep_parts.split(",")) if a.sweep else set()
    SWEEP_CASE_S = a.sweep_case_s
    if a.tiny:
        H, Hkv, D = 4, 2, 64
        att_cases = [(2, 40, 1), (1, 40, 4)]
        shapes = {"qkv": (48, 96), "o": (32, 64), "gate_up": (64, 64), "down": (32, 160), "lm_head": (80, 64)}
        ms, batches, ctx = [1, 4], [1, 2], 40
        onelaunch_cases = [(1, 40), (2, 72)]
    else:
        H, Hkv, D = 32, 8, 128
        att_cases = [(B, c, 1) for B in (1, 8, 64) for c in (1024, 8192)] + [(8, 8192, 4), (1, 8192, 16)]
        shapes = LLAMA8B_LINEARS
        ms, batches, ctx = [1, 4, 16], [1, 8], 8192
        onelaunch_cases = [(B, c) for B in (1, 4) for c in (1024, 4096, 8192)]
    res["shape"] = {"heads": H, "kv_heads": Hkv, "head_dim": D}
    if "attention" in parts:
        bench_attention(att_cases, H, Hkv, D, dev, bw, "attention" in swept, deadline, res, save)
    if "int4" in parts:
        bench_int4(shapes, ms, 32, dev, bw, "int4" in swept, deadline, res, save)
        res["int4_model_step"] = int4_model_estimate(res["int4"])
    if "encoded" in parts:
        bench_encoded([s for s in a.schemes.split(",") if s], batches, ctx, H, Hkv, D, dev, bw, "encoded" in swept, deadline,
                      res, save)
    if "attn-onelaunch" in parts:
        bench_onelaunch(onelaunch_cases, H, Hkv, D, dev, bw, res, save, a.onelaunch_variants_s)
    res["total_s"] = time.perf_counter() - t0
    save()
    print(format_table(res))
    return 0


def format_table(res: dict) -> str:
    lines = [f"Triton decode kernels on {res['device']} (read bandwidth {res['read_bandwidth_GBps']:.0f} GB/s)", ""]
    for r in res.get("attention", []):
        lines.append(f"attention B={r['batch']:<3} ctx={r['ctx']:<5} q={r['max_q']:<3} gather+SDPA "
                     f"{r['current_us']:8.1f} us ({r['current_bw_fraction']:4.0%})  kernel {r['kernel_us']:8.1f} us "
                     f"({r['kernel_bw_fraction']:4.0%})  {r['speedup']:5.2f}x")
    for r in res.get("int4", []):
        tg = (f"tinygemm {r['tinygemm_us']:7.1f} us ({r['tinygemm_bw_fraction']:4.0%})  {r['speedup_vs_tinygemm']:5.2f}x"
              if "tinygemm_us" in r else "")
        lines.append(f"int4 {r['linear']:<8}{r['N']:>6}x{r['K']:<6}M={r['M']:<3} kernel {r['kernel_us']:7.1f} us "
                     f"({r['kernel_bw_fraction']:4.0%})  {tg}  bf16 {r['bf16_us']:7.1f} us")
    est = res.get("int4_model_step")
    if est and "kernel_us" in est:
        lines.append(f"int4 8B step (32 layers + lm_head, M=1): kernel {est['kernel_us'] / 1e3:.2f} ms"
                     + (f", tinygemm {est['tinygemm_us'] / 1e3:.2f} ms" if "tinygemm_us" in est else ""))
    for row in res.get("encoded", []):
        for k, r in row.items():
            if isinstance(r, dict):
                lines.append(f"encoded {k:<12} B={row['batch']} ctx={row['ctx']}: {r['kernel_us']:.1f} us (old grid "
                             f"{r['old_grid_us']:.1f}); native gather+SDPA {row['native_current_us']:.1f} us -> "
                             f"{r['vs_native_current']:.2f}x; native kernel {row['native_kernel_us']:.1f} us -> "
                             f"{r['vs_native_kernel']:.2f}x")
    for r in res.get("attn_onelaunch", []):
        t, o = r["two_launch"], r["one_launch"]
        lines.append(f"attn-onelaunch B={r['batch']} ctx={r['ctx']:<5} two-launch {t['us']:6.2f} us "
                     f"({t['GBps']:5.0f} GB/s, {t['block_n']}x{t['splits']})  one-launch {o['us']:6.2f} us "
                     f"({o['GBps']:5.0f} GB/s, {o['block_n']}x{o['splits']})  {r['speedup']:4.2f}x  "
                     f"max|one-two| {r['max_abs_diff_one_vs_two']:.2g}  bitwise replays {r['replays_bitwise_equal']}"
                     f"  counters zero {r['counters_zero']}")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
