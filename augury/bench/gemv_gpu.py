"""Microbenchmark of the one-row fused GEMV (augury.layers.triton_gemv) against cuBLAS, 8B shapes.

    python -m augury.bench.gemv_gpu --out DIR [--sweep] [--budget-s 150] [--weights int4]

For each Llama-3-8B product a batch-1 decode step runs (qkv with the input norm folded in,
o_proj with the residual add, gate_up with the post-attention norm, down with SiLU-mul and
the residual, and the LM head plain): the cuBLAS product alone (`F.linear`, what the
unfused layer launches besides its norm/activation/add kernels), the fused kernel at its
default launch parameters, and with --sweep the best parameters found by coordinate search.
Times are per call, from CUDA-graph replays over distinct weight copies (several times the
L2), as in `augury.bench.kernels_gpu`; bandwidth = weight bytes / time, against a read
bandwidth measured in the same run. Also checks the fused result against the unfused ops.
`--weights int4` runs the same products on int4 weights (group 32): the row-layout GEMV
(`triton_gemv_w4r`) at its defaults, the GEMV on tinygemm's bytes and tinygemm's own kernel; with
`--chains layer_chain` also the whole fused layer on int4 weights in the layout `--int4-layout` names. bf16 also times two 32-layer chains (`chain`: a layer's four
products back to back; `layer_chain`: the whole fused layer with attention, under several
programmatic-dependent-launch choices). Writes DIR/gemv_gpu_{bf16,int4}.json.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch
import torch.nn.functional as F

from augury.layers.int4_layout import transpose_scales
from augury.bench.kernels_gpu import coordinate_search, copies_for, read_bandwidth, time_calls

# name -> (N, K, prologue, residual), llama3-8b
SHAPES = {
    "qkv": (6144, 4096, "norm", False),
    "o_proj": (4096, 4096, None, True),
    "gate_up": (28672, 4096, "norm", False),
    "down": (4096, 14336, "silu_mul", True),
    "lm_head": (128256, 4096, None, False),
}
GRID = {"block_n": [2, 4, 8, 16, 32], "block_k": [256, 512, 1024, 2048], "num_warps": [2, 4, 8],
        "num_stages": [1, 2, 3]}
# int4 runs the split-K kernel of `triton_gemv_w4r` on its own layout: its W4RowsConfig (the entries
# per slice stay the default's: a tile-major weight is laid out for them)
GRID_W4 = {"block_n": [64, 32, 128], "rows_per_program": [256, 512, 128, 1024], "num_warps": [4, 8, 2],
           "stages": [1, 3, 2, 4]}
GROUP = 32  # int4 group size (what `--weights int4` quantizes with)


def _int4_weight(N: int, K: int, dev: torch.device, seed: int) -> dict:
    """A random int4 weight as `Int4Linear` keeps it on CUDA: tinygemm's packed bytes + bf16 (scale, zero)."""
    from augury.layers.quant_linear import _pack_fn

    from augury.layers.int4_layout import pack

    g = torch.Generator(device=dev).manual_seed(seed)
    q = torch.randint(0, 16, (N, K), generator=g, device=dev, dtype=torch.int32)
    sz = (torch.rand(K // GROUP, N, 2, generator=g, device=dev) * 0.01).to(torch.bfloat16)
    # off CUDA (tests) the same bytes written out by `int4_layout.pack`
    w = _pack_fn("cuda", 8)(q) if dev.type == "cuda" else pack(q, 8)
    return {"w": w, "scales_zeros": sz, "group_size": GROUP}


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def bench_shape(name: str, dev: torch.device, bw: float, sweep: bool, deadline: float, int4: bool = False) -> dict:
    from augury.layers import triton_gemv_w4, triton_gemv_w4r
    from augury.layers.triton_gemv import GemvConfig, default_config, gemv

    N, K, pro, res = SHAPES[name]
    dt = torch.bfloat16
    nbytes = N * K // 2 + (K // GROUP) * N * 4 if int4 else N * K * 2
    n = copies_for(nbytes)
    if int4:
        from augury.layers.triton_gemv_w4r import pack_from_tinygemm

        ws = [_int4_weight(N, K, dev, i) for i in range(n)]
        for w in ws:  # the scales transposed to [N, G] (the tinygemm-layout GEMV), and the GEMV's own copy
            w["sz_t"] = transpose_scales(w["scales_zeros"])
            w["rows"], w["rows_sz"] = pack_from_tinygemm(w["w"], w["sz_t"], GROUP)
    else:
        ws = [{"w": torch.randn(N, K, device=dev, dtype=dt) * 0.02} for _ in range(n)]
    kin = 2 * K if pro == "silu_mul" else K
    x = torch.randn(1, kin, device=dev, dtype=dt)
    r = torch.randn(1, N, device=dev, dtype=dt) if res else None
    g = torch.rand(K, device=dev, dtype=dt) + 0.5 if pro == "norm" else None
    xin = F.silu(x[:, :K]) * x[:, K:] if pro == "silu_mul" else x

    def fused(w, cfg=None, pdl=None, in_place=False):
        if int4 and (cfg is None or isinstance(cfg, triton_gemv_w4r.W4RowsConfig)):  # what Int4Linear runs
            w = {"w": w["rows"], "scales_zeros": w["rows_sz"], "group_size": GROUP}
        elif int4:  # tinygemm's bytes: the transposed scales copy, or tinygemm's pairs in place
            w = {"w": w["w"], "scales_zeros": w["scales_zeros" if in_place else "sz_t"], "group_size": GROUP}
        return gemv(x, **w, norm_weight=g, eps=1e-5, silu_mul=pro == "silu_mul", residual=r, cfg=cfg, pdl=pdl)

    def unfused(w):  # the product the unfused layer launches (besides its norm/activation/add kernels)
        if int4:
            return torch.ops.aten._weight_int4pack_mm(xin, w["w"], GROUP, w["scales_zeros"])
        return F.linear(xin, w["w"])

    # correctness against the unfused ops (fp32 product of the same rounded inputs)
    xr = (g * F.rms_norm(x.float(), (K,), None, 1e-5).to(dt)) if pro == "norm" else xin
    if int4:
        eye = torch.eye(K, device=dev, dtype=dt)
        w32 = torch.cat([torch.ops.aten._weight_int4pack_mm(eye[i:i + 1024], ws[0]["w"], GROUP,
                                                            ws[0]["scales_zeros"]) for i in range(0, K, 1024)]).T.float()
    else:
        w32 = ws[0]["w"].float()
    ref = F.linear(xr.float(), w32)
    ref = (ref.to(dt).float() + r.float()) if res else ref
    err = (fused(ws[0]).float() - ref).abs().max().item() / max(1e-6, ref.abs().max().item())
    del w32

    t_cublas = time_calls([lambda w=w: unfused(w) for w in ws], dev)
    cfg0 = triton_gemv_w4r.default_config(N, K) if int4 else default_config(N, K)
    t_fused = time_calls([lambda w=w: fused(w, cfg0) for w in ws], dev)
    t_nopdl = time_calls([lambda w=w: fused(w, cfg0, pdl=False) for w in ws], dev)
    # int4: the earlier GEMV on tinygemm's bytes (`triton_gemv_w4`), its transposed scales / the pairs in place
    cfg_tg = triton_gemv_w4.default_config(N, K, 8) if int4 else None
    t_tg = time_calls([lambda w=w: fused(w, cfg_tg) for w in ws], dev) if int4 else None
    t_inplace = time_calls([lambda w=w: fused(w, cfg_tg, in_place=True) for w in ws], dev) if int4 else None
    # int4: the tinygemm-layout GEMV's exact fp32 decode instead of the packed fp16x2 products (W4SplitConfig.half2)
    cfg32 = replace(cfg_tg, half2=False) if int4 else None
    t_f32 = time_calls([lambda w=w: fused(w, cfg32) for w in ws], dev) if int4 else None
    err32 = (fused(ws[0], cfg32).float() - ref).abs().max().item() / max(1e-6, ref.abs().max().item()) if int4 else None
    # int4: the default with row tiles pipelined through shared memory, or not (W4RowsConfig.stages)
    t_stages = {st: time_calls([lambda w=w: fused(w, replace(cfg0, stages=st)) for w in ws], dev)
                for st in (1, 2, 3, 4) if st != cfg0.stages} if int4 else {}
    row = {"name": name, "weights": "int4" if int4 else "bf16", "unfused_kernel": "tinygemm" if int4 else "cuBLAS",
           "N": N, "K": K, "prologue": pro, "residual": res, "weight_MB": nbytes / 1e6,
           "rel_err": err, "cublas_us": t_cublas, "cublas_frac_bw": nbytes / (t_cublas * 1e-6) / bw,
           "fused_default_us": t_fused, "fused_default_frac_bw": nbytes / (t_fused * 1e-6) / bw,
           "default_config": cfg0.__dict__, "fused_no_pdl_us": t_nopdl,
           "fused_no_pdl_frac_bw": nbytes / (t_nopdl * 1e-6) / bw, "fused_tinygemm_layout_us": t_tg,
           "fused_scales_in_place_us": t_inplace,
           "fused_fp32_decode_us": t_f32, "fp32_decode_rel_err": err32, "fused_stages_us": t_stages}
    if sweep:
        def evaluate(p: dict) -> float:
            cfg = triton_gemv_w4r.W4RowsConfig(**p) if int4 else GemvConfig(**p)
            return time_calls([lambda w=w: fused(w, cfg) for w in ws], dev, reps=7)

        best, best_t, tried = coordinate_search(GRID_W4 if int4 else GRID, dict(cfg0.__dict__), evaluate,
                                                deadline)
        row.update(best_config=best, fused_best_us=best_t, fused_best_frac_bw=nbytes / (best_t * 1e-6) / bw,
                   tried=tried)
    _log(f"{name} ({row['weights']}): {row['unfused_kernel']} {t_cublas:.1f} us ({row['cublas_frac_bw']:.1%}), fused {t_fused:.1f} us "
         f"({row['fused_default_frac_bw']:.1%}; {t_nopdl:.1f} us without PDL"
         + (f"; on tinygemm's bytes {t_tg:.1f} us, {t_inplace:.1f} us with its scales in place, {t_f32:.1f} us "
            f"with the fp32 decode, "
            f"rel err {err32:.2e}; stages " + ", ".join(f"{k_}: {v:.1f} us" for k_, v in t_stages.items())
            if int4 else "") + ")"
         + (f", best {row['fused_best_us']:.1f} us ({row['fused_best_frac_bw']:.1%}) {row['best_config']}"
            if sweep else "") + f", rel err {err:.2e}")
    ws.clear()
    torch.cuda.empty_cache()
    return row


def bench_chain(dev: torch.device, bw: float, layers: int = 32) -> dict:
    """A decode step's four products per layer back to back over `layers` layers of distinct
    weights (the order a fused layer launches them, attention left out): fused with and
    without PDL against the cuBLAS products alone."""
    from augury.layers.triton_gemv import gemv

    dt = torch.bfloat16
    names = ("qkv", "o_proj", "gate_up", "down")
    W = [{n: torch.randn(SHAPES[n][0], SHAPES[n][1], device=dev, dtype=dt) * 0.02 for n in names}
         for _ in range(layers)]
    g = torch.rand(4096, device=dev, dtype=dt) + 0.5
    h = torch.randn(1, 4096, device=dev, dtype=dt)
    o = torch.randn(1, 4096, device=dev, dtype=dt)
    gu = torch.randn(1, 2 * 14336, device=dev, dtype=dt)
    act = F.silu(gu[:, :14336]) * gu[:, 14336:]

    def fused(L, pdl):
        gemv(h, L["qkv"], norm_weight=g, eps=1e-5, pdl=pdl)
        hh = gemv(o, L["o_proj"], residual=h, pdl=pdl)
        gemv(hh, L["gate_up"], norm_weight=g, eps=1e-5, pdl=pdl)
        gemv(gu, L["down"], silu_mul=True, residual=hh, pdl=pdl)

    def cublas(L):
        F.linear(h, L["qkv"]), F.linear(o, L["o_proj"]), F.linear(h, L["gate_up"]), F.linear(act, L["down"])

    nbytes = sum(SHAPES[n][0] * SHAPES[n][1] * 2 for n in names)
    row = {"layers": layers, "weight_MB_per_layer": nbytes / 1e6}
    for name, fns in (("cublas", [lambda L=L: cublas(L) for L in W]),
                      ("fused_pdl", [lambda L=L: fused(L, True) for L in W]),
                      ("fused_no_pdl", [lambda L=L: fused(L, False) for L in W])):
        t = time_calls(fns, dev)
        row[f"{name}_us_per_layer"] = t
        row[f"{name}_frac_bw"] = nbytes / (t * 1e-6) / bw
    _log("chain per layer: " + ", ".join(f"{k} {row[k + '_us_per_layer']:.1f} us ({row[k + '_frac_bw']:.1%})"
                                         for k in ("cublas", "fused_pdl", "fused_no_pdl")))
    del W
    torch.cuda.empty_cache()
    return row


# layer-chain variants: PDL per kernel (attention: a `triton_paged_decode.PDL_MODES` value),
# whether o_proj loads its first weight tile before its PDL wait (o_early) and whether the other
# products do (early); attn_kw: attention's launch overrides
_ON = {"qkv": True, "attn": 1, "o_proj": True, "o_early": True, "gate_up": True, "down": True, "early": True}
LAYER_VARIANTS = {
    "pdl": _ON,
    "attention_no_pdl": _ON | {"attn": 0},  # AUGURY_ATTN_PDL=0 (the eleventh session's default)
    "attention_pdl_o_waits": _ON | {"o_early": False},
    "attention_late": _ON | {"attn": 2},
    "attention_late_o_waits": _ON | {"attn": 2, "o_early": False},
    "attention_waits": _ON | {"attn": 3},  # the default (AUGURY_ATTN_PDL=wait)
    "attention_end": _ON | {"attn": 4},
    "attention_end_o_waits": _ON | {"attn": 4, "o_early": False},
    "attention_waits_o_waits": _ON | {"attn": 3, "o_early": False},
    # every product loads its first weight tile after its PDL wait (early: False)
    "attention_waits_no_early_weights": _ON | {"attn": 3, "o_early": False, "early": False},
    "attention_no_pdl_no_early_weights": _ON | {"attn": 0, "o_early": False, "early": False},
    "o_proj_no_pdl": _ON | {"o_proj": False},
    "no_pdl": {n: False for n in _ON} | {"attn": 0},
    # attention's own launch (splits x key tiles; default at 1k keys: 9 x 128 keys, 4 warps)
    "attention_no_pdl_5splits": _ON | {"attn": 0, "attn_kw": {"num_splits": 5, "block_n": 128}},
    "attention_no_pdl_16x64": _ON | {"attn": 0, "attn_kw": {"num_splits": 16, "block_n": 64}},
    "attention_no_pdl_8warps": _ON | {"attn": 0, "attn_kw": {"num_warps": 8}},
    "attention_late_o_waits_16x64": _ON | {"attn": 2, "o_early": False,
                                           "attn_kw": {"num_splits": 16, "block_n": 64}},
    "attention_waits_stages4": _ON | {"attn": 3, "attn_kw": {"num_stages": 4}},
    "attention_waits_2warps": _ON | {"attn": 3, "attn_kw": {"num_warps": 2}},
    # attention leaves its splits unmerged and o_proj merges them in its prologue (fused_decode's default:
    # AUGURY_DEFER_MERGE); bf16 o_proj then runs the split-K GEMV (`triton_gemv_split`)
    "defer_merge": _ON | {"attn": 3, "defer": True},
    # attention without its L2 hints for the first key tiles before the PDL wait (AUGURY_ATTN_L2_PREFETCH=0)
    "attention_waits_no_l2": _ON | {"attn": 3, "attn_kw": {"l2_tiles": 0}},
    "defer_merge_no_l2": _ON | {"attn": 3, "defer": True, "attn_kw": {"l2_tiles": 0}},
}
# the split-K GEMV's launch under the deferred merge (bf16 o_proj: triton_gemv_split.SplitConfig fields)
_SPLIT_CFGS = {"r64": {"rows_per_program": 64}, "r256": {"rows_per_program": 256}, "w8": {"num_warps": 8},
               "bn8": {"block_n": 8}, "bn32": {"block_n": 32}, "w2": {"num_warps": 2},
               "bn32_w2": {"block_n": 32, "num_warps": 2}, "bn64": {"block_n": 64}}
LAYER_VARIANTS.update({f"defer_split_{k}": _ON | {"attn": 3, "defer": True, "split_cfg": v}
                       for k, v in _SPLIT_CFGS.items()})
# per-product launch overrides on top of attention_waits: name -> {product: (block_n, block_k, num_warps)}
# (none beat the defaults in the chain on the H200: docs/benchmarks.md, "Nineteenth session")
_CFGS = {
    "o16x2048w8": {"o_proj": (16, 2048, 8)}, "o8x4096w8": {"o_proj": (8, 4096, 8)},
    "o4x2048w4": {"o_proj": (4, 2048, 4)}, "o8x1024w4": {"o_proj": (8, 1024, 4)},
    "o16x4096w8": {"o_proj": (16, 4096, 8)}, "o4x4096w8": {"o_proj": (4, 4096, 8)},
    "q8x1024w4": {"qkv": (8, 1024, 4)}, "q16x512w8": {"qkv": (16, 512, 8)}, "q8x256w2": {"qkv": (8, 256, 2)},
    "q8x2048w8": {"qkv": (8, 2048, 8)}, "q16x1024w8": {"qkv": (16, 1024, 8)},
    "g16x1024w8": {"gate_up": (16, 1024, 8)}, "g8x2048w8": {"gate_up": (8, 2048, 8)},
    "d8x1024w4": {"down": (8, 1024, 4)}, "d32x1024w8": {"down": (32, 1024, 8)},
}
LAYER_VARIANTS.update({f"cfg_{k}": _ON | {"attn": 3, "cfg": v} for k, v in _CFGS.items()})
# the next kernel launched late (after a program's weight stream, not at its PDL wait): every product, or one
_LATE = ("qkv", "o_proj", "gate_up", "down")
LAYER_VARIANTS["late_all"] = _ON | {"attn": 3, "cfg": {p: {"late_launch": True} for p in _LATE}}
LAYER_VARIANTS.update({f"late_{p}": _ON | {"attn": 3, "cfg": {p: {"late_launch": True}}} for p in _LATE})
# int4 row-layout overrides (W4RowsConfig fields; products on tinygemm's bytes keep their defaults)
_W4_CFGS = {
    "down_rpp256": {"down": {"rows_per_program": 256}}, "down_rpp128": {"down": {"rows_per_program": 128}},
    "down_st1": {"down": {"stages": 1}}, "down_rpp256_st1": {"down": {"rows_per_program": 256, "stages": 1}},
    "qkv_st1": {"qkv": {"stages": 1}}, "qkv_rpp256": {"qkv": {"rows_per_program": 256}},
    "late_all": {p: {"late_launch": True} for p in _LATE}, "late_down": {"down": {"late_launch": True}},
    "late_qkv": {"qkv": {"late_launch": True}},
    "late_all_d256": {p: {"late_launch": True} for p in _LATE} | {"down": {"late_launch": True, "rows_per_program": 256}},
    "late_all_d256_st1": {p: {"late_launch": True} for p in _LATE}
    | {"down": {"late_launch": True, "rows_per_program": 256, "stages": 1}},
    "late_all_q256": {p: {"late_launch": True} for p in _LATE} | {"qkv": {"late_launch": True, "rows_per_program": 256}},
    "late_all_d256_q256": {p: {"late_launch": True} for p in _LATE}
    | {"down": {"late_launch": True, "rows_per_program": 256}, "qkv": {"late_launch": True, "rows_per_program": 256}},
    "late_but_down": {p: {"late_launch": True} for p in _LATE[:3]},
    "late_but_down_d256": {p: {"late_launch": True} for p in _LATE[:3]} | {"down": {"rows_per_program": 256}},
    # on top of the defaults since the twenty-first session (late launch; down 256 rows, no pipeline)
    "early_all": {p: {"late_launch": False} for p in _LATE},
    "d128": {"down": {"rows_per_program": 128}}, "d512": {"down": {"rows_per_program": 512}},
    "d256_st3": {"down": {"stages": 3}}, "q_st1": {"qkv": {"stages": 1}}, "q256": {"qkv": {"rows_per_program": 256}},
    "g512": {"gate_up": {"rows_per_program": 512}}, "g2048": {"gate_up": {"rows_per_program": 2048}},
    "o128": {"o_proj": {"rows_per_program": 128}}, "o512": {"o_proj": {"rows_per_program": 512}},
}
LAYER_VARIANTS.update({f"w4_{k}": _ON | {"attn": 3, "w4cfg": v} for k, v in _W4_CFGS.items()})
# the tensor-core GEMV's (W4MmaConfig fields)
# the forty-fourth session's H100 probe's best Gluon launch per product: (rows a program, warps, stages)
GLUON_BEST = {"gate_up": (896, 4, 8), "down": (256, 1, 8), "qkv": (128, 2, 4), "o_proj": (64, 1, 4)}


def _gluon_cfgs(best: dict) -> dict:
    return {p: {"gluon": s, "rows_per_program": nb, "num_warps": w} for p, (nb, w, s) in best.items()}


_W4M_CFGS = {
    "early_all": {p: {"late_launch": False} for p in _LATE}, "late_all": {p: {"late_launch": True} for p in _LATE},
    "pf1_all": {p: {"prefetch": 1} for p in _LATE}, "pf2_all": {p: {"prefetch": 2} for p in _LATE},
    "d256": {"down": {"rows_per_program": 256}}, "d1024": {"down": {"rows_per_program": 1024}},
    "q512": {"qkv": {"rows_per_program": 512}}, "q128": {"qkv": {"rows_per_program": 128}},
    "o256": {"o_proj": {"rows_per_program": 256}}, "o64": {"o_proj": {"rows_per_program": 64}},
    "g256": {"gate_up": {"rows_per_program": 256}}, "g1024": {"gate_up": {"rows_per_program": 1024}},
    "w8_all": {p: {"num_warps": 8} for p in _LATE},
    # two warps a program, half the rows (the same tiles per warp; twice the programs: finer balance)
    "w2_all": {"qkv": {"num_warps": 2, "rows_per_program": 128}, "o_proj": {"num_warps": 2, "rows_per_program": 64},
               "gate_up": {"num_warps": 2, "rows_per_program": 256}, "down": {"num_warps": 2, "rows_per_program": 256}},
    "w2_down": {"down": {"num_warps": 2, "rows_per_program": 256}},
    "w2_gate_up": {"gate_up": {"num_warps": 2, "rows_per_program": 256}},
    "w2_qkv": {"qkv": {"num_warps": 2, "rows_per_program": 128}},
    "w2_o_proj": {"o_proj": {"num_warps": 2, "rows_per_program": 64}},
    "o_pf2": {"o_proj": {"prefetch": 2}},
    # the loop's loads through Triton's cp.async pipeline (fewer registers, more tiles in flight; no tile
    # loaded before the PDL wait)
    **{f"st{n}_all": {p: {"stages": n} for p in _LATE} for n in (2, 3, 4)},
    **{f"st3_{p}": {p: {"stages": 3}} for p in _LATE},
    # a row chunk's K slices launched together (its last program's sums and epilogue all along the launch)
    "km_all": {p: {"k_major": True} for p in _LATE}, **{f"km_{p}": {p: {"k_major": True}} for p in _LATE},
    # three or four tiles in flight per warp (fewer programs resident, more bytes in flight on each SM);
    # qkv and o_proj with more rows a program, so their warps have the tiles to keep that many in flight
    **{f"pf{n}_{p}": {p: {"prefetch": n}} for n in (3, 4) for p in ("gate_up", "down")},
    "pf3_all": {p: {"prefetch": 3} for p in _LATE}, "pf4_all": {p: {"prefetch": 4} for p in _LATE},
    "pf4_q256": {"qkv": {"rows_per_program": 256, "prefetch": 4}},
    "pf4_o256": {"o_proj": {"rows_per_program": 256, "prefetch": 4}},
    "pf4_g1024": {"gate_up": {"rows_per_program": 1024, "prefetch": 4}},
    # gate_up's 28,672 rows in 32 chunks of 896 (512 programs: one wave at four a multiprocessor) or 64 of 448
    "g896": {"gate_up": {"rows_per_program": 896}}, "g448": {"gate_up": {"rows_per_program": 448}},
    "pf4_big": {"gate_up": {"prefetch": 4}, "down": {"prefetch": 4}, "qkv": {"rows_per_program": 256, "prefetch": 4},
                "o_proj": {"rows_per_program": 256, "prefetch": 4}},
    # the persistent grid (`triton_gemv_w4m_stream`): N programs a multiprocessor, each an equal run of the tiles;
    # with 3, four tiles in flight fit (168 registers)
    "ps4_all": {p: {"persistent": 4} for p in _LATE}, **{f"ps4_{p}": {p: {"persistent": 4}} for p in _LATE},
    "ps3pf4_all": {p: {"persistent": 3, "prefetch": 4} for p in _LATE},
    "ps3pf3_all": {p: {"persistent": 3, "prefetch": 3} for p in _LATE},
    # down on the device's Triton 3.6 takes 136 registers at 2 tiles in flight: three programs a multiprocessor
    "ps3_down": {"down": {"persistent": 3}}, "ps3pf1_down": {"down": {"persistent": 3, "prefetch": 1}},
    # each loop step also asks the L2 for the warp's tile N beyond its register prefetch (no registers)
    **{f"l2a{n}_all": {p: {"l2_ahead": n} for p in _LATE} for n in (1, 2, 3)},
    **{f"l2a{n}_gd": {p: {"l2_ahead": n} for p in ("gate_up", "down")} for n in (1, 2, 4)},
    # ... or only before the PDL wait, the tiles after those loaded there; with the cp.async stages (which load
    # nothing before the wait), its first stages' tiles
    **{f"l2f{n}_all": {p: {"l2_first": n} for p in _LATE} for n in (1, 2)},
    **{f"st{n}f{n - 1}_all": {p: {"stages": n, "l2_first": n - 1} for p in _LATE} for n in (2, 3, 4)},
    "st3f4_all": {p: {"stages": 3, "l2_first": 4} for p in _LATE},
    # the weight loads' cache hints (0 none, 1 .cg, 2 evict-first: the default since the thirty-ninth session)
    **{f"wc{n}_all": {p: {"weight_cache": n} for p in _LATE} for n in (0, 1, 2)},
    # tiles staged through shared memory (cp.async) by programs of one or two warps: the pipeline's barrier is
    # then a warp's own, the registers drop to 72 (down, offline sm_90), and the bytes in flight are no longer
    # what the registers hold (4 warps: 87.7 against 78.3 us a layer, thirty-ninth session, call 2). Measured on an
    # H100 (forty-first session): all slower than the default's 72.05 us a layer (74.6-81.7, means of two rounds),
    # w1_down equal (72.1)
    **{f"w1st{n}_down": {"down": {"num_warps": 1, "rows_per_program": 128, "stages": n}} for n in (3, 4, 6)},
    "w1_down": {"down": {"num_warps": 1, "rows_per_program": 128}},
    "w2st4_down": {"down": {"num_warps": 2, "rows_per_program": 256, "stages": 4}},
    "st4_down": {"down": {"stages": 4}},
    "w2st4_gate_up": {"gate_up": {"num_warps": 2, "rows_per_program": 448, "stages": 4}},
    "st4_gate_up": {"gate_up": {"stages": 4}},
    "w1st4_o_proj": {"o_proj": {"num_warps": 1, "rows_per_program": 32, "stages": 4}},
    "st4_qkv": {"qkv": {"stages": 4}},
    # the Gluon-staged product (`gluon_gemv_w4m`): each thread's own cp.async copies, no barrier in the loop; the
    # forty-fourth session's H100 probe's best (rows, warps, stages) per product, and a second set. In the chain on
    # that H100 all slower than the default's 72.2-72.4 us a layer: gl_all 91.7-93.3, gl2_all 82.6, gl_qkv 74.5,
    # gl_o_proj 76.2, gl_gate_up 82.9, gl_down 86.5
    **{f"gl_{p}": {p: c} for p, c in _gluon_cfgs(GLUON_BEST).items()},
    "gl_all": _gluon_cfgs(GLUON_BEST),
    "gl2_all": _gluon_cfgs(GLUON_BEST | {"gate_up": (448, 4, 4), "down": (512, 4, 4)}),
}
LAYER_VARIANTS.update({f"w4m_{k}": _ON | {"attn": 3, "w4mcfg": v} for k, v in _W4M_CFGS.items()})
# attention asks the L2 for o_proj's weight lines once its q is in (`paged_decode_attention(l2_warm=...)`)
LAYER_VARIANTS["attention_warms_o"] = _ON | {"attn": 3, "warm_o": True}
# the same for products on tinygemm's bytes (W4SplitConfig fields)
LAYER_VARIANTS["w4t_late_all"] = _ON | {"attn": 3, "w4tcfg": {p: {"late_launch": True} for p in _LATE}}
LAYER_VARIANTS.update({f"w4t_late_{p}": _ON | {"attn": 3, "w4tcfg": {p: {"late_launch": True}}} for p in _LATE})


def _chain_weight(N: int, K: int, dev: torch.device, seed: int, int4: str | None) -> dict:
    """One product's weight as the layer chain passes it to `gemv` / `qkv_rope_kv`: bf16 [N, K]
    (int4 None), or int4 group 32 in tinygemm's bytes with the transposed scales ("tinygemm") or in
    the row-layout GEMV's own copy ("rows"), as `Int4Linear` hands them over."""
    if int4 is None:
        return {"w": torch.randn(N, K, device=dev, dtype=torch.bfloat16) * 0.02}
    from augury.layers.triton_gemv_w4r import pack_from_tinygemm

    w = _int4_weight(N, K, dev, seed)
    szt = transpose_scales(w["scales_zeros"])
    if int4 == "rows":
        wr, sr = pack_from_tinygemm(w["w"], szt, GROUP)
        return {"w": wr, "scales_zeros": sr, "group_size": GROUP}
    if int4 == "mma":
        from augury.layers import triton_gemv_w4m

        wm, sm = triton_gemv_w4m.pack_from_tinygemm(w["w"], szt)
        return {"w": wm, "scales_zeros": sm, "group_size": GROUP}
    return {"w": w["w"], "scales_zeros": szt, "group_size": GROUP}


_LAYOUT_LETTERS = {"r": "rows", "t": "tinygemm", "m": "mma"}


def int4_mix(spec: str) -> str:
    """An int4 layer-chain layout spec as one letter per product (qkv, o_proj, gate_up, down), r(ows),
    t(inygemm) or m(ma): "rows" -> "rrrr", "tinygemm" -> "tttt", "mma" -> "mmmm", a four-letter mix as it
    is ("trrr": qkv on tinygemm's bytes, the rest on the row layout), so a chain can swap one product's
    layout at a time."""
    mix = {"rows": "rrrr", "tinygemm": "tttt", "mma": "mmmm"}.get(spec, spec)
    if len(mix) != 4 or set(mix) - set(_LAYOUT_LETTERS):
        raise ValueError(f"int4 layout {spec!r}: rows, tinygemm, mma, or four letters r/t/m (qkv, o_proj, gate_up, "
                         "down)")
    return mix


def bench_layer_chain(dev: torch.device, bw: float, layers: int = 32, ctx: int = 1024,
                      variants: list[str] | None = None, probe: bool = False, rounds: int = 1,
                      int4: str | list[str] | None = None) -> dict:
    """A whole fused decode layer as `fused_decode.llama_layer` launches it (qkv with rope and
    the K/V write, paged attention over `ctx` cached tokens, o_proj + residual, gate_up + norm,
    down + SiLU-mul + residual), back to back over `layers` layers of distinct weights and pools:
    per layer with attention and without it (o_proj then reads a fixed input), under the
    programmatic-dependent-launch choices of `LAYER_VARIANTS` (attention's: AUGURY_ATTN_PDL's
    modes). The difference with and without attention is what attention costs in the chain
    (against its time alone: `augury.bench.kernels_gpu --only attn-onelaunch`). probe: attention
    also writes in-kernel timestamps (`triton_probe.stamp`), summarized by `_probe_summary`.
    rounds: the variant list is timed that many times over, in order (so drift during the run
    spreads over every variant); each variant keeps every round's figures and their medians.
    int4: "rows" or "tinygemm", the products on int4 weights in that layout (`_chain_weight`; their
    launch overrides and early-tile switches are bf16's and do not apply), or a list of `int4_mix`
    specs: every variant is timed once per spec (keyed "variant@spec"), each product on the same
    nibbles in the layout its letter names."""
    from augury.bench.kernels_gpu import _attention_case
    from augury.layers import triton_gemv_w4, triton_gemv_w4m, triton_gemv_w4r
    from augury.layers.triton_gemv import GemvConfig, default_config, gemv, qkv_rope_kv
    from augury.layers.triton_paged_decode import l2_warm_tensors, paged_decode_attention

    dt = torch.bfloat16
    H, Hkv, D = 32, 8, 128
    names = ("qkv", "o_proj", "gate_up", "down")
    gm, n_slots = _attention_case(1, ctx, 1, H, Hkv, D, dev, dt)
    bias = gm.additive_mask(dt)
    mixes = None if int4 is None else [int4_mix(m) for m in ([int4] if isinstance(int4, str) else int4)]
    letters = sorted({c for m in mixes for c in m}) if mixes else [None]
    W = [{n: {c: _chain_weight(SHAPES[n][0], SHAPES[n][1], dev, 4 * i + j, _LAYOUT_LETTERS.get(c))
              for c in letters} for j, n in enumerate(names)}
         | {"kp": torch.randn(n_slots, Hkv, D, device=dev, dtype=dt),
            "vp": torch.randn(n_slots, Hkv, D, device=dev, dtype=dt)} for i in range(layers)]
    g = torch.rand(4096, device=dev, dtype=dt) + 0.5
    h = torch.randn(1, 4096, device=dev, dtype=dt)
    o_fixed = torch.randn(1, H * D, device=dev, dtype=dt)
    # the partials o_proj merges without attention before it (defer variants): the real ones of one step
    parts_fixed = paged_decode_attention(torch.randn(1, 1, H, D, device=dev, dtype=dt), W[0]["kp"], W[0]["vp"],
                                         gm.gather_slots, bias, D ** -0.5, defer_merge=True) \
        if any(LAYER_VARIANTS[n].get("defer") for n in variants or LAYER_VARIANTS) else None
    cos, sin = torch.rand(D, device=dev, dtype=dt), torch.rand(D, device=dev, dtype=dt)
    stamps = [torch.zeros(1024, 5, dtype=torch.int64, device=dev) for _ in range(layers)] if probe else None

    def cfg(pdl, name, letter=None):
        if int4 is not None:  # int4: W4RowsConfig / W4MmaConfig / W4SplitConfig fields over the product's default
            over = pdl.get({"r": "w4cfg", "m": "w4mcfg"}.get(letter, "w4tcfg"), {}).get(name)
            if not over:
                return None
            n, k = SHAPES[name][:2]
            base = {"r": lambda: triton_gemv_w4r.default_config(n, k), "m": lambda: triton_gemv_w4m.default_config(n, k),
                    "t": lambda: triton_gemv_w4.default_config(n, k, 8)}[letter]
            return replace(base(), **over)
        if name == "o_proj" and pdl.get("split_cfg"):
            from augury.layers.triton_gemv_split import SplitConfig

            return SplitConfig(**pdl["split_cfg"])
        c = pdl.get("cfg", {}).get(name)
        if c is None:
            return None  # the product's default
        return replace(default_config(*SHAPES[name][:2]), **c) if isinstance(c, dict) else GemvConfig(*c)

    def layer(L, pdl, attn, i=None, mix=None):
        wt = {n: L[n][None if mix is None else mix[j]] for j, n in enumerate(names)}
        q = qkv_rope_kv(h, **wt["qkv"], norm_weight=g, eps=1e-5, cos=cos, sin=sin, k_pool=L["kp"], v_pool=L["vp"],
                        slot=gm.slot_mapping, num_heads=H, num_kv_heads=Hkv, pdl=pdl["qkv"],
                        early_weights=pdl["early"], cfg=cfg(pdl, "qkv", mix and mix[0]))
        defer = pdl.get("defer", False)
        if attn:
            # warm_o: attention asks the L2 for o_proj's weight (and scales) while the DRAM idles under it
            warm = l2_warm_tensors(wt["o_proj"]) if pdl.get("warm_o") else ()
            o = paged_decode_attention(q.view(1, 1, H, D), L["kp"], L["vp"], gm.gather_slots, bias, D ** -0.5,
                                       pdl_mode=pdl["attn"], **pdl.get("attn_kw", {}),
                                       times=None if i is None else stamps[i], defer_merge=defer, l2_warm=warm)
        else:
            o = parts_fixed if defer else o_fixed
        if defer:
            hh = gemv(o[0], **wt["o_proj"], residual=h, merge_ml=o[1], pdl=pdl["o_proj"],
                      cfg=cfg(pdl, "o_proj", mix and mix[1]))
        else:
            hh = gemv(o.reshape(1, H * D), **wt["o_proj"], residual=h, pdl=pdl["o_proj"],
                      early_weights=pdl["o_early"], cfg=cfg(pdl, "o_proj", mix and mix[1]))
        gu = gemv(hh, **wt["gate_up"], norm_weight=g, eps=1e-5, pdl=pdl["gate_up"], early_weights=pdl["early"],
                  cfg=cfg(pdl, "gate_up", mix and mix[2]))
        gemv(gu, **wt["down"], silu_mul=True, residual=hh, pdl=pdl["down"], early_weights=pdl["early"],
             cfg=cfg(pdl, "down", mix and mix[3]))

    nbytes = sum(SHAPES[n][0] * SHAPES[n][1] * 2 if int4 is None else SHAPES[n][0] * SHAPES[n][1] // 2
                 + (SHAPES[n][1] // GROUP) * SHAPES[n][0] * 4 for n in names)
    row = {"layers": layers, "ctx": ctx, "rounds": rounds,
           "weights": "bf16" if mixes is None else int4 if isinstance(int4, str) else ",".join(mixes),
           "weight_MB_per_layer": nbytes / 1e6, "variants": {}}
    # (variant, layout mix, key): one int4 layout keeps the variant names; a list of them suffixes each
    runs = [(name, m, name if m is None or isinstance(int4, str) else f"{name}@{m}")
            for m in (mixes or [None]) for name in variants or LAYER_VARIANTS]
    for rnd in range(rounds):
        for name, mix, key_name in runs:
            pdl = LAYER_VARIANTS[name]
            v = row["variants"].setdefault(key_name, {"pdl": pdl, "int4_mix": mix, "runs": []})
            run = {}
            for attn in (True, False):
                t = time_calls([lambda L=L: layer(L, pdl, attn, mix=mix) for L in W], dev)
                run["with_attention_us" if attn else "without_attention_us"] = t
            v["runs"].append(run)
            for key in ("with_attention_us", "without_attention_us"):
                v[key] = statistics.median(r[key] for r in v["runs"])
            v["attention_in_chain_us"] = v["with_attention_us"] - v["without_attention_us"]
            v["frac_bw_with_attention"] = nbytes / (v["with_attention_us"] * 1e-6) / bw
            if probe and rnd == 0:
                for t in stamps:
                    t.zero_()
                v["probe_us_per_layer"] = time_calls([lambda L=L, i=i: layer(L, pdl, True, i, mix=mix)
                                                      for i, L in enumerate(W)], dev)
                v["probe"] = _probe_summary([t.cpu() for t in stamps])
                _log(f"attention probe, {key_name}: {json.dumps(v['probe'])}")
            _log(f"layer chain [{rnd + 1}/{rounds}], {key_name}: {run['with_attention_us']:.1f} us per layer, "
                 f"{run['without_attention_us']:.1f} without attention (adds "
                 f"{run['with_attention_us'] - run['without_attention_us']:.1f})")
    W.clear()
    torch.cuda.empty_cache()
    return row


def _probe_summary(stamps: list[torch.Tensor]) -> dict:
    """Medians over layers of attention's in-kernel stamps ([programs, 5] %globaltimer ns per
    layer, 0 where not written; stamps: 0 start, 1 last tile's q.k done, 2 its p.v done,
    3 arrived at the split counter (split launches merged in-kernel), 4 merged output stored
    (the last program of each KV head)), in us after the layer's first program started: the
    median and the last program at each stamp, and the gap from one layer's last stamp to the
    next layer's first (the products between them). Differences are taken in int64 (the stamps
    are ~1.8e18 ns: float64 alone would round them to 256 ns); a stamp no program wrote is None."""
    names = ("start", "k_tile", "v_tile", "arrived")
    rows, ends = [], []
    for t in stamps:
        t = t[t[:, 0] > 0]
        t0, t_end = int(t[:, 0].min()), int(t.max())
        row = {"programs": t.shape[0]}
        for i, name in enumerate(names):
            col = t[t[:, i] > 0, i]
            rel = (col - t0).double() / 1e3
            row[f"{name}_median_us"] = rel.median().item() if rel.numel() else None
            row[f"{name}_last_us"] = rel.max().item() if rel.numel() else None
        merged = t[t[:, 4] > 0, 4]
        row["merged_us"] = (int(merged.max()) - t0) / 1e3 if merged.numel() else None
        rows.append(row)
        ends.append((t0, t_end))

    def med(xs):
        xs = [x for x in xs if x is not None]
        return round(statistics.median(xs), 3) if xs else None

    out = {k: med(r[k] for r in rows) for k in rows[0]}
    out["gap_to_next_layer_us"] = med((ends[i + 1][0] - ends[i][1]) / 1e3 for i in range(len(ends) - 1))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m augury.bench.gemv_gpu")
    ap.add_argument("--out", default=os.environ.get("OUT", "bench_out"))
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--budget-s", type=float, default=150.0)
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--weights", choices=["bf16", "int4"], default="bf16",
                    help="int4: tinygemm's packed weights (group 32) against tinygemm's kernel")
    ap.add_argument("--no-chain", action="store_true", help="skip the 32-layer chains (bf16 only)")
    ap.add_argument("--chains", default="chain,layer_chain",
                    help="which chains to time (bf16; with --weights int4 only layer_chain)")
    ap.add_argument("--int4-layout", default="tinygemm",
                    help="layer chain with --weights int4: rows (the GEMV's own layout), mma (the tensor-core "
                         "GEMV's), tinygemm (its bytes), "
                         "or a comma list of those and four-letter r/t mixes per product (qkv, o_proj, "
                         "gate_up, down), each timed in turn")
    ap.add_argument("--attn-probe", action="store_true", help="layer chain: attention's in-kernel timestamps too")
    ap.add_argument("--ctx", type=int, default=1024, help="layer chain: cached tokens attention reads")
    ap.add_argument("--rounds", type=int, default=1, help="layer chain: times the variant list is timed over")
    ap.add_argument("--layer-variants", default="attention_waits,attention_no_pdl,pdl,no_pdl",
                    help=f"layer-chain PDL variants, of {','.join(LAYER_VARIANTS)}")
    a = ap.parse_args(argv)
    variants = [v for v in a.layer_variants.split(",") if v]
    chains = [c for c in a.chains.split(",") if c]
    bad = [c for c in chains if c not in ("chain", "layer_chain")] + \
        [v for v in variants if v not in LAYER_VARIANTS]
    if bad:
        ap.error(f"unknown chain or layer variant {', '.join(bad)} (chains: chain, layer_chain; variants: "
                 f"{', '.join(LAYER_VARIANTS)})")
    if len(set(variants)) != len(variants):
        ap.error("--layer-variants: each variant once (the JSON keeps one result per name)")
    specs = [m for m in a.int4_layout.split(",") if m]
    try:
        for m in specs:
            int4_mix(m)
    except ValueError as e:
        ap.error(f"--int4-layout: {e}")
    if not torch.cuda.is_available():
        print("gemv_gpu needs a CUDA device", file=sys.stderr)
        return 2
    dev = torch.device("cuda")
    bw = read_bandwidth(dev)
    _log(f"read bandwidth {bw / 1e9:.0f} GB/s")
    names = [s for s in a.shapes.split(",") if s]
    per = a.budget_s / max(1, len(names))
    rows = []
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    for s in names:
        rows.append(bench_shape(s, dev, bw, a.sweep, time.perf_counter() + per, a.weights == "int4"))
        (out / f"gemv_gpu_{a.weights}.json").write_text(json.dumps({"bandwidth_GBps": bw / 1e9, "rows": rows},
                                                                    indent=1))
    res = {"bandwidth_GBps": bw / 1e9, "rows": rows, "chain": None, "layer_chain": None}
    if not a.no_chain:
        int4 = (specs[0] if len(specs) == 1 else specs) if a.weights == "int4" else None
        run = {"chain": bench_chain,
               "layer_chain": lambda d, b: bench_layer_chain(d, b, ctx=a.ctx, variants=variants, probe=a.attn_probe,
                                                             rounds=a.rounds, int4=int4)}
        for key in chains:
            if int4 is not None and key != "layer_chain":
                continue
            res[key] = run[key](dev, bw)
            (out / f"gemv_gpu_{a.weights}.json").write_text(json.dumps(res, indent=1))
    tot_c = sum(r["cublas_us"] * (32 if r["name"] != "lm_head" else 1) for r in rows)
    tot_f = sum(min(r["fused_default_us"], r.get("fused_best_us", math.inf))
                * (32 if r["name"] != "lm_head" else 1) for r in rows)
    print(f"per token (32 layers + head, {a.weights}): unfused products {tot_c / 1e3:.3f} ms, fused "
          f"{tot_f / 1e3:.3f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
