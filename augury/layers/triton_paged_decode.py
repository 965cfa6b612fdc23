"""Paged decode attention over a native (bf16/fp16/fp32) KV pool, in Triton, for the CUDA path.

The eager path gathers every slot a request reads into a dense [B, Hkv, max_kv, D]
copy (index_select) and then calls SDPA: at batch 64 that copy is written and read
again, so attention moves about three times the bytes it needs. This kernel reads
the pool rows in place through `gather_slots`. Measured on the H200 (llama3-8b shapes,
bf16, docs/data/kernels-h200.json): 1.3-3.1x faster than gather + SDPA for decode (B = 64:
86-99% of HBM bandwidth), 5x for verify windows of 4-16 rows.

One program owns (request, kv head, split of the context). Its query rows are the
request's max_q new tokens x the heads sharing that kv head (GQA), so each K/V tile
is loaded once for all of them and fed to tensor-core dots. Splits (flash-decoding)
keep the GPU busy when batch x kv heads is small (B = 1 at long context). The partial
softmax states are merged in the same launch: the program of a (request, kv head) that
writes its partial last (an atomic counter, `triton_splitkv.arrive_last`) merges all of
them in split order and writes the output, so the result is bitwise the same whichever
program finishes last, and a decode step is one launch per layer. That makes splits
cheaper (one launch per layer; splits of a single tile allowed: `plan_launch`).
`one_launch=False` keeps the older way (the earlier split choice and a second merge
kernel) for comparison. With a single split the kernel normalizes and writes the output
itself.

Calling convention = `augury.kv.codecs.triton_attention.encoded_decode_attention`
(q [B, max_q, H, D], gather_slots [B, max_kv], additive mask [B, 1, max_q, max_kv]).
The mask is read on every call, never rebuilt: CUDA graphs refill it in place. The
grid depends only on shapes, so the call can be captured. Written so it also runs
under TRITON_INTERPRET=1 on the CPU (tests).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from augury.layers.triton_splitkv import (  # noqa: F401 (num_splits_for: re-exported for the benchmarks)
    arrive_last, merge_chunk, merge_partials, merge_splits_kernel, num_splits_for, partials, release_counter,
    sm_count, split_counters, split_plan, splits_for_sms)
from augury.layers.triton_pdl import pdl_enabled, prefetch_l2
from augury.layers.triton_probe import stamp

# Programmatic dependent launch (PDL) around attention. AUGURY_ATTN_PDL picks where attention
# sits in the chain of dependent launches; in every PDL mode it waits (gdc_wait) before it reads:
#   wait (default): launched with PDL (its programs are resident while the qkv product drains),
#     the next kernel starts only when attention ends;
#   0: launched without PDL;  1: with PDL, and the next kernel may start at once;
#   late: the next kernel may start once the key tiles are in (before the merge);
#   end: the next kernel may start once the output rows are stored.
# In a chain of fused 8B layers on the H200 (`python -m augury.bench.gemv_gpu`, layer chain;
# docs/benchmarks.md "Twelfth session"), `wait` took up to 2 us a layer less than `0`; `1` and
# `late`, which let o_proj start while attention still loads, cost 6-10 us more: o_proj's
# programs, even idle at their own wait, slow this latency-bound kernel's loads. `end` measured
# 0.2-1.6 us slower than `wait`.
PDL_MODES = {"0": 0, "1": 1, "late": 2, "wait": 3, "end": 4}


def pdl_mode_from(value: str | None) -> int:
    """AUGURY_ATTN_PDL's value (None: unset) -> a `PDL_MODES` value; an unknown one is refused."""
    if value is None:
        return PDL_MODES["wait"]
    if value not in PDL_MODES:
        raise ValueError(f"AUGURY_ATTN_PDL={value!r}: use one of {', '.join(PDL_MODES)} (unset: wait)")
    return PDL_MODES[value]


_PDL_MODE = pdl_mode_from(os.environ.get("AUGURY_ATTN_PDL"))
# the small-batch launches' L2 prefetch of the first key tiles before the PDL wait (`LaunchConfig.l2_tiles`);
# =0: off (A/B measurements)
_L2_PREFETCH_ON = os.environ.get("AUGURY_ATTN_L2_PREFETCH", "1") != "0"
MAX_QUERY_ROWS = 64  # max_q * (H / Hkv) per program; wider steps (prefill) take the eager path
_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def supported(q: torch.Tensor, k_pool: torch.Tensor, max_q: int | None = None) -> bool:
    """True when this kernel can run a step with these query rows over this pool.

    q: [T, H, D] or [B, max_q, H, D]; k_pool: [num_slots, Hkv, D] (a plain tensor;
    encoded stores have their own kernel)."""
    if not isinstance(k_pool, torch.Tensor) or k_pool.dim() != 3:
        return False
    H, D = q.shape[-2], q.shape[-1]
    Hkv = k_pool.shape[1]
    if max_q is None:
        max_q = q.shape[1] if q.dim() == 4 else 1
    on_device = q.device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"  # CPU: interpreter (tests)
    return (on_device and k_pool.device == q.device
            and q.dtype in _DTYPES and k_pool.dtype in _DTYPES
            and k_pool.shape[2] == D and H % Hkv == 0 and D <= 256
            and 1 <= max_q * (H // Hkv) <= MAX_QUERY_ROWS)


@triton.jit
def _warm_share(ptr, n_lines, pid, P, T: tl.constexpr):
    """Program pid of P asks the L2 for its share of the n_lines 128-byte lines at ptr (clamped to the last
    line: a repeated hint is harmless; a hint never reads past the tensor)."""
    base = ptr.to(tl.pointer_type(tl.int8))
    share = tl.cdiv(n_lines, P)
    lo = pid * share
    for i0 in range(0, share, T):
        line = tl.minimum(lo + i0 + tl.arange(0, T), n_lines - 1).to(tl.int64)
        prefetch_l2(base + line * 128, False)


@triton.jit
def _paged_decode_kernel(
    q_ptr, k_ptr, v_ptr, gather_ptr, bias_ptr, o_ptr,
    acc_ptr, m_ptr, l_ptr, cnt_ptr, t_ptr,
    max_q, max_kv, split_len, num_splits, sm_scale, softcap, n_slots,
    s_qb, s_qj, s_qh, s_kslot, s_kh, s_vslot, s_vh, s_gb, s_bb, s_bj, s_bn, s_ob, s_oj, s_oh,
    REP: tl.constexpr, D: tl.constexpr, HKV: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    USE_SOFTCAP: tl.constexpr, FP32: tl.constexpr, SPLIT: tl.constexpr,
    ONE_LAUNCH: tl.constexpr, MERGE_ROWS: tl.constexpr, MERGE_SPLITS: tl.constexpr, MERGE_CHUNK: tl.constexpr,
    PREFETCH: tl.constexpr, PDL: tl.constexpr, TIMES: tl.constexpr = False, DEFER: tl.constexpr = False,
    L2_TILES: tl.constexpr = 0, LINES: tl.constexpr = 1, LINE: tl.constexpr = 64,
    warm0_ptr=None, warm0_lines=0, warm1_ptr=None, warm1_lines=0, WARM: tl.constexpr = 0, WARM_T: tl.constexpr = 128,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    sp = tl.program_id(2)
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < D
    row_ok = offs_m < max_q * REP
    j = tl.minimum(offs_m // REP, max_q - 1)  # query token of each program row
    head = h * REP + offs_m % REP
    lo = sp * split_len
    hi = tl.minimum(lo + split_len, max_kv)
    k_base = k_ptr + h * s_kh + offs_d[None, :]
    v_base = v_ptr + h * s_vh + offs_d[None, :]
    if L2_TILES > 0:
        # before the wait: the L2 fetches this split's first key tiles (K and V, one hint per 128-byte line),
        # so after it their loads find them there instead of starting a DRAM round trip behind the kernel
        # before. A hint holds no registers and cannot read stale data: the L2 is where every write lands
        # (this step's new K/V row included), and the loads that use the rows all come after the wait.
        # The slots are read before the wait too (clamped: a prefetch must not leave the pool)
        offs_l = tl.minimum(tl.arange(0, LINES) * LINE, D - 1)
        for t in tl.static_range(L2_TILES):
            n_t = lo + t * BLOCK_N + offs_n
            sl = tl.load(gather_ptr + b * s_gb + n_t, mask=n_t < hi, other=0)
            sl = tl.minimum(tl.maximum(sl, 0), n_slots - 1).to(tl.int64)[:, None]
            prefetch_l2(k_ptr + h * s_kh + sl * s_kslot + offs_l[None, :])
            prefetch_l2(v_ptr + h * s_vh + sl * s_vslot + offs_l[None, :])
    if PDL > 0:  # may start while the kernel before it runs (q and this step's K/V row come from it)
        tl.extra.cuda.gdc_wait()
    if PDL == 1:
        tl.extra.cuda.gdc_launch_dependents()  # o_proj may start streaming its weights
    if TIMES:  # probe (benchmarks): 5 stamps per program, t_ptr [programs, 5]
        t_ptr += ((b * HKV + h) * num_splits + sp) * 5
        stamp(t_ptr, 0, sp)
    q = tl.load(q_ptr + b * s_qb + j[:, None] * s_qj + head[:, None] * s_qh + offs_d[None, :],
                mask=row_ok[:, None] & d_ok[None, :], other=0.0)  # [M, BD]
    cdt = q.dtype
    if WARM > 0:
        # the next kernel's weights asked of the L2 (`l2_warm`): at one token attention leaves the DRAM idle
        # for microseconds (its own rows are L2 hits, fetched before the wait), and o_proj comes next
        P = tl.num_programs(0) * HKV * num_splits
        pid = (b * HKV + h) * num_splits + sp
        _warm_share(warm0_ptr, warm0_lines, pid, P, WARM_T)
        if WARM > 1:
            _warm_share(warm1_ptr, warm1_lines, pid, P, WARM_T)

    m_i = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)  # finite: fully masked tiles stay NaN-free
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    bias_rows = bias_ptr + b * s_bb + j[:, None] * s_bj
    if PREFETCH:
        # the next tile's slots and mask are loaded a tile ahead: its K/V loads need not wait for
        # the slots, and its scores not for the mask (loaded in the loop, the mask was an L2 read
        # issued only once the K tile had arrived: one more dependent round trip per program)
        nxt = tl.load(gather_ptr + b * s_gb + lo + offs_n, mask=lo + offs_n < hi, other=0)
        nxt_bias = tl.load(bias_rows + (lo + offs_n)[None, :] * s_bn, mask=(lo + offs_n < hi)[None, :],
                           other=float("-inf"))
    for start in range(lo, hi, BLOCK_N):
        n = start + offs_n
        n_ok = n < hi
        if PREFETCH:
            slots = nxt.to(tl.int64)
            bias = nxt_bias  # [M, N], converted where the scores use it
            nxt = tl.load(gather_ptr + b * s_gb + n + BLOCK_N, mask=n + BLOCK_N < hi, other=0)
            nxt_bias = tl.load(bias_rows + (n + BLOCK_N)[None, :] * s_bn, mask=(n + BLOCK_N < hi)[None, :],
                               other=float("-inf"))
        else:
            slots = tl.load(gather_ptr + b * s_gb + n, mask=n_ok, other=0).to(tl.int64)
            bias = tl.load(bias_rows + n[None, :] * s_bn, mask=n_ok[None, :], other=float("-inf"))
        ld = n_ok[:, None] & d_ok[None, :]
        k = tl.load(k_base + slots[:, None] * s_kslot, mask=ld, other=0.0).to(cdt)  # [N, BD]
        v = tl.load(v_base + slots[:, None] * s_vslot, mask=ld, other=0.0).to(cdt)
        if FP32:
            s = tl.dot(q, tl.trans(k), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(k))
        s = s * sm_scale
        if USE_SOFTCAP:  # s = c * tanh(s / c), tanh through exp (overflow-free form)
            t = tl.exp(-2.0 * tl.abs(s / softcap))
            s = tl.where(s >= 0, 1.0, -1.0) * softcap * (1.0 - t) / (1.0 + t)
        s = s + bias.to(tl.float32)
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        p = tl.exp(s - m_new[:, None])
        alpha = tl.exp(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        if FP32:
            acc = acc * alpha[:, None] + tl.dot(p.to(cdt), v, input_precision="ieee")
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(cdt), v)
        m_i = m_new
    if TIMES:
        stamp(t_ptr, 1, tl.max(l_i, axis=0))  # the last tile's q.k is done (its K tile is in)
        stamp(t_ptr, 2, tl.sum(tl.sum(acc, axis=1), axis=0))  # and its p.v (its V tile)
    if PDL == 2:  # the key tiles are in: the next kernel may start during the merge
        tl.extra.cuda.gdc_launch_dependents()
    if DEFER:  # B = 1, one query row a head: partials in the next product's input order (it merges them)
        hs = sp * (HKV * REP) + head  # acc [S, H * D]; m, l [S, H]
        tl.store(m_ptr + hs, m_i, mask=row_ok)
        tl.store(l_ptr + hs, l_i, mask=row_ok)
        tl.store(acc_ptr + hs[:, None] * D + offs_d[None, :], acc, mask=row_ok[:, None] & d_ok[None, :])
        if TIMES:
            stamp(t_ptr, 3, sp)  # the partial's stores are issued (the kernel's end follows)
    elif SPLIT:
        part = (b * HKV + h) * num_splits + sp  # partials: [B, Hkv, S, M(, BD)]
        if ONE_LAUNCH:  # only the real rows: the merge below reads them back from L2
            tl.store(m_ptr + part * BLOCK_M + offs_m, m_i, mask=row_ok)
            tl.store(l_ptr + part * BLOCK_M + offs_m, l_i, mask=row_ok)
            tl.store(acc_ptr + (part * BLOCK_M + offs_m[:, None]) * BLOCK_D + offs_d[None, :], acc,
                     mask=row_ok[:, None] & d_ok[None, :])
            counter = cnt_ptr + b * HKV + h
            last = arrive_last(counter, num_splits)
            if TIMES:
                stamp(t_ptr, 3, last)
            if last:  # every split of (b, h) has stored its partial
                o = merge_partials(acc_ptr, m_ptr, l_ptr, (b * HKV + h) * num_splits, num_splits, max_q * REP,
                                   BLOCK_M=BLOCK_M, BLOCK_D=BLOCK_D, D=D, ROWS=MERGE_ROWS, SPLITS=MERGE_SPLITS,
                                   CHUNK=MERGE_CHUNK)
                offs_r = tl.arange(0, MERGE_ROWS)
                jr = offs_r // REP
                hr = h * REP + offs_r % REP
                dst = o_ptr + b * s_ob + jr[:, None] * s_oj + hr[:, None] * s_oh + offs_d[None, :]
                tl.store(dst, o.to(o_ptr.dtype.element_ty), mask=(offs_r < max_q * REP)[:, None] & d_ok[None, :])
                release_counter(counter)
                if TIMES:
                    stamp(t_ptr, 4, tl.sum(tl.sum(o, axis=1), axis=0))
                if PDL == 4:  # the output is stored (this (b, h)'s other splits have arrived)
                    tl.extra.cuda.gdc_launch_dependents()
        else:  # a second kernel merges (merge_splits_kernel)
            tl.store(m_ptr + part * BLOCK_M + offs_m, m_i)
            tl.store(l_ptr + part * BLOCK_M + offs_m, l_i)
            tl.store(acc_ptr + (part * BLOCK_M + offs_m[:, None]) * BLOCK_D + offs_d[None, :], acc)
    else:
        o = acc / tl.maximum(l_i, 1.0e-30)[:, None]
        dst = o_ptr + b * s_ob + j[:, None] * s_oj + head[:, None] * s_oh + offs_d[None, :]
        tl.store(dst, o.to(o_ptr.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])
        if PDL == 4:
            tl.extra.cuda.gdc_launch_dependents()


@dataclass(frozen=True)
class LaunchConfig:
    block_n: int  # keys per tile
    num_warps: int
    num_stages: int
    waves: float  # split the context until the grid covers the GPU this many times over
    min_tiles: int = 2  # ... but keep at least this many key tiles per split
    prefetch: bool = False  # load each tile's gather slots one tile ahead
    l2_tiles: int = 0  # key tiles of each split the L2 is asked to fetch before the PDL wait (CUDA only)


def launch_config(rows: int, batch_kv_heads: int, d: int, device: torch.device,
                  one_launch: bool = True) -> LaunchConfig:
    """Launch parameters from shapes alone (the same step always compiles and launches the same).
    The split count needs the context length too: `plan_launch`."""
    return _launch_config(rows, batch_kv_heads, d, sm_count(device), one_launch)


def _launch_config(rows: int, batch_kv_heads: int, d: int, sms: int, one_launch: bool) -> LaunchConfig:
    """From H200 sweeps (llama3-8b shapes, bf16; graph replay over 32 layers' pools).

    Two launches (docs/data/kernels-h200.json): few programs (B <= 2) want long 128-key tiles
    and one wave of splits; a full grid (B = 64: 512 programs) runs best at 2 warps, more
    resident programs per SM. One launch (`python -m augury.bench.kernels_gpu --only
    attn-onelaunch`): B = 1 still wants 128-key tiles and ~one wave, but splits of a single
    tile are allowed (1k keys: 9 splits of 128 keys, 9-10 us, vs 10.9 for 5 splits + merge
    kernel; 64- or 32-key tiles over 136-264 programs were slower, 10.4-14 us: each split's
    dependent load chain and the merge tail cost more than the extra programs bring); B = 4
    (32 request x kv-head pairs) runs best at 2 warps with the slots prefetched (4k: 29 vs 33 us).
    Full grids (B = 64: no split) and wide verify windows keep their swept choices."""
    if rows > 16:  # wide verify windows (16 rows x 4 heads swept at B = 1: 128-key tiles, one wave)
        return LaunchConfig(128, 4, 3, 1.0) if batch_kv_heads <= 16 else LaunchConfig(64, 4, 3, 2.0)
    if batch_kv_heads <= 16:
        cfg = LaunchConfig(128, 4, 3, 1.0, min_tiles=1 if one_launch else 2, prefetch=one_launch, l2_tiles=1)
    elif batch_kv_heads < 2 * sms:
        cfg = LaunchConfig(64, 2, 3, 2.0, prefetch=True) if one_launch else LaunchConfig(64, 4, 3, 2.0)
    else:
        cfg = LaunchConfig(64, 2, 3, 2.0)
    if d > 128:
        cfg = LaunchConfig(min(cfg.block_n, 32), 4, 2, cfg.waves, cfg.min_tiles, cfg.prefetch)
    return cfg


def plan_launch(rows: int, batch_kv_heads: int, max_kv: int, d: int, sms: int,
                one_launch: bool = True) -> tuple[LaunchConfig, int]:
    """(launch config, number of splits) for BLOCK_M = `rows` query rows per program,
    B x Hkv = `batch_kv_heads`, `max_kv` keys, BLOCK_D = `d`, on a GPU of `sms` multiprocessors.

    A pure function of its integers: a step of given shapes always launches the same grid
    (CUDA graphs capture it). On the H200 (132 SMs), B = 1 with 8 kv heads: 1k keys -> 9
    splits of one 128-key tile (72 programs), 4k-8k -> 17 splits (136 programs); B = 4 ->
    9 splits of 64-key tiles (288 programs); B = 64 -> no split (512 programs).
    one_launch=False: the choice of the two-launch path."""
    cfg = _launch_config(rows, batch_kv_heads, d, sms, one_launch)
    S = splits_for_sms(batch_kv_heads, max_kv, cfg.block_n, sms, waves=cfg.waves, min_tiles=cfg.min_tiles)
    return cfg, split_plan(max_kv, S, cfg.block_n)[0]


def l2_warm_tensors(weight: dict) -> tuple[torch.Tensor, ...]:
    """A `gemv` weight's keywords (`fused_decode._weight`) -> the tensors `paged_decode_attention(l2_warm=...)`
    takes for it: the weight and, where it has them, its scales (contiguous ones only, as that argument needs)."""
    return tuple(t for t in (weight.get("w"), weight.get("scales_zeros")) if t is not None and t.is_contiguous())


def paged_decode_attention(
    q: torch.Tensor,  # [B, max_q, H, D]
    k_pool: torch.Tensor,  # [num_slots, Hkv, D]
    v_pool: torch.Tensor,
    gather_slots: torch.Tensor,  # [B, max_kv] long
    bias: torch.Tensor,  # [B, 1, max_q, max_kv] additive (0 / -inf), any float dtype
    scale: float,
    softcap: float | None = None,
    num_splits: int | None = None,
    block_n: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    one_launch: bool = True,
    prefetch: bool | None = None,
    l2_tiles: int | None = None,
    pdl_mode: int | None = None,
    times: torch.Tensor | None = None,
    defer_merge: bool = False,
    l2_warm: tuple[torch.Tensor, ...] = (),
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """-> [B, max_q, H, D] in q's dtype. Pool rows are cast to q's dtype on load.
    defer_merge: B = 1 and max_q = 1 only; the splits' partials are left for the next product to
    merge, returned as (acc float32 [S, H * D], ml float32 [2, S, H]): `paged_decode_partials`.

    one_launch: splits are merged by the last program of each (request, kv head) in the
    same launch, with the split choice made for that (default); False: the older split
    choice and a second merge kernel (benchmarks compare them). num_splits / block_n /
    num_warps / num_stages / prefetch / l2_tiles override the choice (tests, sweeps; l2_tiles is 0 off
    CUDA: the interpreter has no inline PTX); pdl_mode: a value of
    `PDL_MODES` instead of AUGURY_ATTN_PDL's (benchmarks); l2_warm: up to two contiguous tensors (the next
    product's weight and scales) whose lines the programs ask the L2 for, shared out among them, once
    their own q is loaded (a hint: no result changes; CUDA only); times: a contiguous int64 CUDA tensor
    of at least [programs, 5] for the latency probe (`augury.bench.gemv_gpu --attn-probe`; CUDA only). Inside a CUDA-graph
    capture that finds too few arrival counters (none are created there) the call merges
    with the second kernel."""
    B, max_q, H, D = q.shape
    Hkv = k_pool.shape[1]
    rep = H // Hkv
    max_kv = gather_slots.shape[1]
    if q.stride(-1) != 1:
        q = q.contiguous()
    if k_pool.stride(-1) != 1 or v_pool.stride(-1) != 1:
        raise ValueError("pools need a unit stride along head_dim")
    if gather_slots.stride(-1) != 1:
        gather_slots = gather_slots.contiguous()
    BLOCK_M = max(16, triton.next_power_of_2(max_q * rep))
    BLOCK_D = max(16, triton.next_power_of_2(D))
    cfg, S = plan_launch(BLOCK_M, B * Hkv, max_kv, BLOCK_D, sm_count(q.device), one_launch)
    if block_n or num_splits:
        block_n = block_n or cfg.block_n
        S = num_splits or splits_for_sms(B * Hkv, max_kv, block_n, sm_count(q.device), waves=cfg.waves,
                                         min_tiles=cfg.min_tiles)
    else:
        block_n = cfg.block_n
    S, split_len = split_plan(max_kv, S, block_n)
    num_warps = num_warps or cfg.num_warps
    if defer_merge:
        if B != 1 or max_q != 1:
            raise ValueError(f"paged_decode_attention: defer_merge is for one query token of one request, got "
                             f"B={B}, max_q={max_q}")
        acc = torch.empty((S, H * D), dtype=torch.float32, device=q.device)
        ml = torch.empty((2, S, H), dtype=torch.float32, device=q.device)
        out, m, l = acc, ml[0], ml[1]
        counters = None
    else:
        out = torch.empty((B, max_q, H, D), dtype=q.dtype, device=q.device)
        acc, m, l = partials(out, Hkv, S, BLOCK_M, BLOCK_D)
        # the arrival counters (persistent, zero between launches); none to be had inside a
        # graph capture that needs more than exist -> a second merge kernel instead
        counters = split_counters(q.device, B * Hkv) if one_launch and S > 1 else None
    merged_here = counters is not None
    rows = triton.next_power_of_2(max_q * rep)
    pdl = (_PDL_MODE if pdl_mode is None else pdl_mode) if pdl_enabled(q.device) else 0
    l2 = (cfg.l2_tiles if l2_tiles is None else l2_tiles) if q.device.type == "cuda" and _L2_PREFETCH_ON else 0
    line = 128 // max(k_pool.element_size(), v_pool.element_size())  # pool elements in a 128-byte line
    lines = triton.next_power_of_2(-(-D // line))
    if times is not None and (times.dtype != torch.int64 or not times.is_contiguous() or times.device != q.device
                              or q.device.type != "cuda" or times.numel() < B * Hkv * S * 5):
        raise ValueError(f"paged_decode_attention: times must be a contiguous int64 tensor of >= {B * Hkv * S * 5} "
                         f"elements on q's CUDA device")
    if len(l2_warm) > 2 or any(not t.is_contiguous() for t in l2_warm):
        raise ValueError("paged_decode_attention: l2_warm takes up to two contiguous tensors")
    warm = [t for t in l2_warm if t.device.type == "cuda"] if q.device.type == "cuda" else []
    warm_args = [a for t in warm for a in (t, -(-t.numel() * t.element_size() // 128))]
    warm_args += [out, 0] * (2 - len(warm))
    _paged_decode_kernel[(B, Hkv, S)](
        q, k_pool, v_pool, gather_slots, bias, out, acc, m, l, counters if merged_here else out,
        times if times is not None else out,
        max_q, max_kv, split_len, S, float(scale), float(softcap or 1.0), k_pool.shape[0],
        q.stride(0), q.stride(1), q.stride(2), k_pool.stride(0), k_pool.stride(1),
        v_pool.stride(0), v_pool.stride(1), gather_slots.stride(0),
        bias.stride(0), bias.stride(2), bias.stride(3), *((0, 0, 0) if defer_merge else out.stride()[:3]),
        REP=rep, D=D, HKV=Hkv, BLOCK_M=BLOCK_M, BLOCK_N=block_n, BLOCK_D=BLOCK_D,
        USE_SOFTCAP=softcap is not None, FP32=q.dtype == torch.float32, SPLIT=S > 1,
        ONE_LAUNCH=merged_here, MERGE_ROWS=rows, MERGE_SPLITS=triton.next_power_of_2(S) if merged_here else 1,
        MERGE_CHUNK=merge_chunk(S, rows, BLOCK_D, num_warps) if merged_here else 1,
        PREFETCH=cfg.prefetch if prefetch is None else prefetch, PDL=pdl, TIMES=times is not None, DEFER=defer_merge,
        L2_TILES=l2, LINES=lines, LINE=line, num_warps=num_warps, num_stages=num_stages or cfg.num_stages,
        warm0_ptr=warm_args[0], warm0_lines=warm_args[1], warm1_ptr=warm_args[2], warm1_lines=warm_args[3],
        WARM=len(warm), WARM_T=32 * num_warps, **({"launch_pdl": True} if pdl else {}),
    )
    if defer_merge:
        return acc, ml
    if S > 1 and not merged_here:
        merge_splits_kernel[(B, Hkv)](acc, m, l, out, S, max_q, out.stride(0), out.stride(1), out.stride(2),
                                HKV=Hkv, REP=rep, D=D, BLOCK_M=BLOCK_M, BLOCK_D=BLOCK_D)
    return out


# The same kernel as one opaque node for torch.compile: dynamo cannot trace Triton's
# launcher, and the launch parameters come from concrete shapes (next_power_of_2, the
# split plan), so a compiled graph calls this op with real tensors at run time. The
# eager path calls `paged_decode_attention` directly (no dispatcher hop per layer).
@torch.library.custom_op(
    "augury::paged_decode_attention", mutates_args=(),
    schema="(Tensor q, Tensor k_pool, Tensor v_pool, Tensor gather_slots, Tensor bias, float scale, "
           "float? softcap) -> Tensor")
def paged_decode_op(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, gather_slots: torch.Tensor,
                    bias: torch.Tensor, scale: float, softcap: float | None) -> torch.Tensor:
    return paged_decode_attention(q, k_pool, v_pool, gather_slots, bias, scale, softcap)


@paged_decode_op.register_fake
def _(q, k_pool, v_pool, gather_slots, bias, scale, softcap):
    return q.new_empty(q.shape)  # [B, max_q, H, D], contiguous, q's dtype (as the kernel writes it)


def paged_decode_partials(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, gather_slots: torch.Tensor,
                          bias: torch.Tensor, scale: float, softcap: float | None = None,
                          **launch) -> tuple[torch.Tensor, torch.Tensor]:
    """One token of one request (q [1, 1, H, D]) without the splits' merge: (acc float32 [S, H * D], the
    unnormalized sums of each split in the output's column order, ml float32 [2, S, H], each split's row
    maximum and denominator per head). The next product merges them in its prologue
    (`triton_gemv.gemv(acc, ..., merge_ml=ml)`), so the split programs end at their partial's store: no
    arrival counter, no merge round trips, no output store (on the H200 the merge took ~2.6 us after the
    last arrival, docs/benchmarks.md "Nineteenth session"). launch: `paged_decode_attention`'s overrides."""
    return paged_decode_attention(q, k_pool, v_pool, gather_slots, bias, scale, softcap, defer_merge=True, **launch)


def partial_splits(q_shape, k_pool: torch.Tensor, max_kv: int) -> int:
    """The split count `paged_decode_partials` launches for q [1, 1, H, D] over max_kv keys (shapes only)."""
    H, D = q_shape[-2], q_shape[-1]
    Hkv = k_pool.shape[1]
    BLOCK_M = max(16, triton.next_power_of_2(H // Hkv))
    cfg, S = plan_launch(BLOCK_M, Hkv, max_kv, max(16, triton.next_power_of_2(D)), sm_count(k_pool.device))
    return split_plan(max_kv, S, cfg.block_n)[0]


@torch.library.custom_op(
    "augury::paged_decode_partials", mutates_args=(),
    schema="(Tensor q, Tensor k_pool, Tensor v_pool, Tensor gather_slots, Tensor bias, float scale, "
           "float? softcap) -> (Tensor, Tensor)")
def paged_decode_partials_op(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, gather_slots: torch.Tensor,
                             bias: torch.Tensor, scale: float, softcap: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    return paged_decode_partials(q, k_pool, v_pool, gather_slots, bias, scale, softcap)


@paged_decode_partials_op.register_fake
def _(q, k_pool, v_pool, gather_slots, bias, scale, softcap):
    S, H, D = partial_splits(q.shape, k_pool, gather_slots.shape[1]), q.shape[-2], q.shape[-1]
    return q.new_empty((S, H * D), dtype=torch.float32), q.new_empty((2, S, H), dtype=torch.float32)


def attend_partials(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, gmeta, scale: float,
                    softcap: float | None) -> tuple[torch.Tensor, torch.Tensor] | None:
    """`paged_decode_partials` for a one-token, one-request step q [1, H, D] over plain pools that hold its
    K/V, or None where the step does not fit it (the caller then attends as before)."""
    if (gmeta.parts is not None or gmeta.q_index is not None or gmeta.out_index is not None
            or gmeta.num_seqs != 1 or gmeta.max_q != 1 or q.shape[0] != 1 or not supported(q, k_pool, 1)):
        return None
    run = paged_decode_partials_op if torch.compiler.is_compiling() else paged_decode_partials
    return run(q.view(1, 1, *q.shape[1:]), k_pool, v_pool, gmeta.gather_slots, gmeta.additive_mask(q.dtype),
               scale, softcap)


def attend_paged(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, gmeta, scale: float,
                 softcap: float | None, l2_warm: tuple[torch.Tensor, ...] = ()) -> torch.Tensor:
    """Drop-in for `augury.layers.attention.attend` over a plain pool: q [T, H, D] -> [T, H, D].

    Per segment of the step (GroupAttnMeta.parts: decodes apart from verify windows), the
    kernel where `supported` takes the width; wider segments (prefill chunks) keep the
    gather + SDPA path. The additive mask is read, not rebuilt (CUDA graphs refill it)."""
    if gmeta.parts is None:  # one segment: l2_warm's hints go with its launch (`paged_decode_attention`)
        return _attend_segment(q, k_pool, v_pool, gmeta, scale, softcap, l2_warm)
    return torch.cat([_attend_segment(q[lo:hi], k_pool, v_pool, part, scale, softcap)
                      for lo, hi, part in gmeta.parts])


def _attend_segment(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, gm, scale: float,
                    softcap: float | None, l2_warm: tuple[torch.Tensor, ...] = ()) -> torch.Tensor:
    T, H, D = q.shape
    B, max_q = gm.num_seqs, gm.max_q
    if not supported(q, k_pool, max_q):
        from augury.layers.attention import attend  # that module imports this one lazily

        return attend(q, lambda s: k_pool.index_select(0, s), lambda s: v_pool.index_select(0, s), gm, scale,
                      softcap)
    qp = q.view(B, max_q, H, D) if gm.q_index is None else q.index_select(0, gm.q_index).view(B, max_q, H, D)
    if torch.compiler.is_compiling():  # the opaque op takes no hints
        o = paged_decode_op(qp, k_pool, v_pool, gm.gather_slots, gm.additive_mask(q.dtype), scale, softcap)
    else:
        o = paged_decode_attention(qp, k_pool, v_pool, gm.gather_slots, gm.additive_mask(q.dtype), scale, softcap,
                                   l2_warm=l2_warm)
    o = o.reshape(B * max_q, H, D)
    return o if gm.out_index is None else o.index_select(0, gm.out_index)
