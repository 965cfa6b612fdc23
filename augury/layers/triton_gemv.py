"""One-row matrix-vector products for decode, with the layer's small ops folded in, in Triton.

A batch-1 decode step of a Llama-shaped model on a GPU is a weight stream: every
weight byte is read once per token and the arithmetic is negligible. Measured on the
H200 under `--compile` + CUDA graphs (docs/benchmarks.md, "Sixth session"), cuBLAS
streams the large projections at the bandwidth, but the small ones (qkv, o_proj) use
split-K GEMV kernels plus a reduction kernel and a copy each, at ~75% of it, and every
layer also launches an RMSNorm kernel before each projection, a SiLU-mul kernel and
residual adds: ~16 kernels per layer where the weights need 4.

`gemv` computes y = W x for one row with what surrounds the product inside the same
kernel:
- prologue `norm`: x is RMS-normalised and scaled by the norm's weight on load (each
  program recomputes the sum of squares of x, 8 KB read from L2, instead of a kernel
  and a round trip through memory);
- prologue `silu_mul`: x = [gate; up] from the fused gate/up projection, and the
  product reads silu(gate) * up;
- epilogue `residual`: y + r (the residual stream).
- epilogue `rope_kv` (`qkv_rope_kv`): the qkv projection applies rope to q and k and writes
  this token's K and V straight into the paged pools (what sits between the projection and
  attention: three small kernels otherwise).
Rounding follows the unfused ops step by step (the normalised x is rounded to the
activation dtype before the weight multiplies it, SiLU's output before the product with
`up`, the projection's output before the residual add, each rope product before their sum).
The epilogues round through `_rnd`, explicitly for bf16 (integer bit arithmetic): a
`.to(bf16).to(fp32)` round trip can be folded away by the compiler (seen on the H200 in the
rope epilogue); fp16 keeps the cast round trip. The prologues keep the
cast round trips, since the explicit rounding in the weight loop cost 12% of gate_up's time
(59.8 -> 66.9 us), so on the GPU they may carry the normalised / activated input at more
than the dtype's precision. The fused layer also differs from the unfused one in the order
of the fp32 sums inside the product, and by a few fp32 ulps in the norm's 1/sqrt and SiLU's
exp (Triton's fast versions).

Int4 weights (`scales_zeros` given) go to `augury.layers.triton_gemv_w4`: a split-K kernel that
reads an `Int4Linear`'s packed bytes in place (tinygemm's layout) with the same prologues and
epilogues; for the GEMV's own row-major layout (int32 [N, K / 8], `triton_gemv_w4r.pack`), to
`augury.layers.triton_gemv_w4r`; for the tensor-core GEMV's tiles (int32 [K / 256, N / 16, 512],
`triton_gemv_w4m.pack`: `Int4Linear`'s default where a shape fits them), to `augury.layers.triton_gemv_w4m`. `Int4Linear` only routes here with AUGURY_INT4_GEMV=1 (`quant_linear._INT4_GEMV_ON`
says why it is off by default).

For plain weights each program owns BLOCK_N output rows and walks K in BLOCK_K tiles, keeping a
[BLOCK_N, BLOCK_K / VEC] fp32 partial (one per 16-byte vector a thread loads) that is reduced
once after the loop: no split-K, no second kernel, no atomics, so the result is deterministic
(the int4 kernel splits K and adds the slices in a fixed order: deterministic too). Written so
it also runs under TRITON_INTERPRET=1 on the CPU (tests).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl

from augury.layers import launch_env
from augury.layers.triton_pdl import pdl_enabled

# PRO_MERGE: x is attention's output left as split partials (`triton_paged_decode`'s deferred merge,
# `merge_ml`): the product's prologue merges them
PRO_NONE, PRO_NORM, PRO_SILU_MUL, PRO_MERGE = 0, 1, 2, 3
_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


@dataclass(frozen=True)
class GemvConfig:
    block_n: int = 8
    block_k: int = 1024
    num_warps: int = 4
    num_stages: int = 1
    # under PDL, let the next kernel launch once this program's weight stream is done instead of right
    # after its wait (its programs then take no multiprocessor slots while this grid still streams)
    late_launch: bool = False
    # the weight stream's L2 eviction hint: 0 none, 2 evict-first (the int4 GEMV's `weight_cache` 2: it keeps the
    # activations, partial sums and K/V the stream would otherwise push out of the L2)
    weight_cache: int = 0


def product_class(n: int, k: int) -> str:
    """Which Llama product a [n, k] weight's shape stands for, as `default_config` sorts them."""
    if k >= 2048:
        if k >= 2 * n:
            return "down"
        if n <= k:
            return "o_proj"
        if n <= 2 * k:
            return "qkv"
    return "lm_head" if n >= 65536 else "gate_up"


_ENV_CFG = launch_env.overrides("AUGURY_GEMV_CFG", GemvConfig)  # A/B runs: `launch_env`


def default_config(n: int, k: int) -> GemvConfig:
    """`_default_config` with AUGURY_GEMV_CFG's fields for this product (`launch_env`) over it."""
    cls = product_class(n, k)
    return launch_env.apply(_default_config(cls, k), cls, _ENV_CFG)


def _default_config(cls: str, k: int) -> GemvConfig:
    """Launch parameters from the shape alone, its `product_class` and K (a captured step always
    launches the same grid).

    Rows of K >= 2,048 columns (8B-sized layers) by shape class, from the H200 sweep of the 8B
    products (`python -m augury.bench.gemv_gpu --sweep`, docs/benchmarks.md "Eleventh session"):
    K >= 2N (down: K = 3.5 N) 16-row blocks over 8 warps; N <= K < 2N (o_proj: N = K) 2,048-column
    tiles over 8 warps; K < N <= 2K (qkv: N = 1.5 K) 512-column tiles; N > 2K (gate_up) and every
    smaller layer 8 rows x 1,024 columns over 4 warps (smaller layers were not swept: there the
    wider blocks would leave fewer programs than multiprocessors)."""
    bk = min(1024, triton.next_power_of_2(k))
    if cls == "down":
        return GemvConfig(block_n=16, block_k=bk, num_warps=8)
    if cls == "o_proj":
        return GemvConfig(block_n=8, block_k=2048, num_warps=8)
    if cls == "qkv":
        return GemvConfig(block_n=8, block_k=512, num_warps=4)
    return GemvConfig(block_n=8, block_k=bk, num_warps=4)


def norm_block(block_k: int, k: int) -> int:
    """Columns of x the norm prologue loads at once: at least 1,024 (or all K when fewer). Its loop
    is unrolled 4 times, so at K = 4,096 the sum of squares takes one round of L2 reads instead of
    the two that qkv's 512-column tiles gave it (qkv 68 registers instead of 69; on the H200 B=1
    248.5 vs 248.0-248.2 tok/s, one run: docs/benchmarks.md, "Eighteenth session")."""
    return max(block_k, min(1024, triton.next_power_of_2(k)))


def supported(x: torch.Tensor, w: torch.Tensor) -> bool:
    """True when `gemv` runs x [1, K] against w [N, K]: one row on a CUDA (or interpreted) device,
    a plain floating weight, matching dtypes."""
    on_device = x.device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"
    return (on_device and x.dim() == 2 and x.shape[0] == 1 and w.dim() == 2 and w.device == x.device
            and x.dtype in _DTYPES and w.dtype == x.dtype and w.stride(1) == 1)


@triton.jit
def _rnd(x, dt: tl.constexpr):
    """fp32 x rounded to the dtype `dt` (nearest, ties to even), kept in fp32: the rounding an
    eager op in `dt` applies. bf16 through integer bit arithmetic: a `.to(bf16).to(fp32)` round
    trip may be folded away by the compiler (measured on the H200: rope results several bf16 steps
    off eager's), and the interpreter's cast truncates."""
    if dt == tl.bfloat16:
        bits = x.to(tl.int32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & -65536
        # NaN stays NaN (a NaN's low payload bits would carry into the sign or exponent)
        return tl.where(x != x, x, bits.to(tl.float32, bitcast=True))
    else:  # fp32: nothing to round; fp16: the cast round trip (not made explicit)
        return x.to(dt).to(tl.float32)


@triton.jit
def _gemv_kernel(
    x_ptr, g_ptr, w_ptr, r_ptr, y_ptr,
    N, K, s_wn, eps, norm_k,
    cos_ptr, sin_ptr, kp_ptr, vp_ptr, slot_ptr, s_kslot, s_kh, s_vslot, s_vh, n_q, n_qk,
    PRO: tl.constexpr, RESIDUAL: tl.constexpr, ROPE_KV: tl.constexpr, HALF: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, PDL: tl.constexpr,
    VEC: tl.constexpr, NORM_BLOCK: tl.constexpr, EARLY_W: tl.constexpr = True, LATE_LAUNCH: tl.constexpr = False,
    WC: tl.constexpr = 0,
):
    pid = tl.program_id(0)
    if ROPE_KV:
        # rows in rope pairs: entry 2i is row j0 + i of a head, entry 2i + 1 its partner j0 + i + D/2,
        # so the epilogue has both halves of every rotation it writes
        per_head = HALF // (BLOCK_N // 2)
        head = pid // per_head
        j0 = (pid % per_head) * (BLOCK_N // 2)
        i = tl.arange(0, BLOCK_N)
        rows = head * (2 * HALF) + (i % 2) * HALF + j0 + i // 2
    else:
        rows = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = rows < N
    rows_c = tl.minimum(rows, N - 1)  # out-of-range rows re-read the last one: loads need no row mask
    dt = y_ptr.dtype.element_ty
    offs_k = tl.arange(0, BLOCK_K)
    w_rows = w_ptr + rows_c[:, None].to(tl.int64) * s_wn
    # the first weight tile depends on no earlier kernel: with programmatic dependent launch it
    # is in flight while the kernel before this one finishes (gdc_wait then waits for its writes);
    # with EARLY_W off it is loaded after the wait (the benchmarks compare the two: gemv_gpu)
    if PDL and not EARLY_W:
        tl.extra.cuda.gdc_wait()
    ev: tl.constexpr = "evict_first" if WC == 2 else ""  # GemvConfig.weight_cache, for every weight load
    if EVEN_K:
        w = tl.load(w_rows + offs_k[None, :], eviction_policy=ev)
    else:
        w = tl.load(w_rows + offs_k[None, :], mask=(offs_k < K)[None, :], other=0.0, eviction_policy=ev)
    if PDL and EARLY_W:
        tl.extra.cuda.gdc_wait()  # x (and r) come from the previous kernel
    if PDL and not LATE_LAUNCH:
        tl.extra.cuda.gdc_launch_dependents()  # the next kernel may start loading its weights
    # the residual is loaded now, in flight during the product: loaded after it, it was one more
    # dependent L2 read at the end of every program (H200 B=1 +0.5%). The rope rows and slot stay in
    # the epilogue: loaded here they raised qkv from 69 to 78 registers and cost 3% (docs/benchmarks.md,
    # "Eighteenth session")
    if RESIDUAL:
        r = tl.load(r_ptr + rows, mask=n_ok, other=0.0)
    acc = _dense_rows(w, w_rows, x_ptr, g_ptr, K, eps, norm_k, PRO=PRO, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K,
                      VEC=VEC, dt=dt, NORM_BLOCK=NORM_BLOCK, EV=ev)
    if PDL and LATE_LAUNCH:
        tl.extra.cuda.gdc_launch_dependents()
    y = _rnd(acc, dt).to(dt)  # exact: _rnd already rounded it
    if ROPE_KV:
        _rope_kv_epilogue(y, head, j0, cos_ptr, sin_ptr, y_ptr, kp_ptr, vp_ptr, slot_ptr,
                          s_kslot, s_kh, s_vslot, s_vh, n_q, n_qk, HALF=HALF, P=BLOCK_N // 2)
    else:
        if RESIDUAL:
            y = _rnd(y.to(tl.float32) + r.to(tl.float32), dt).to(dt)
        tl.store(y_ptr + rows, y, mask=n_ok)


@triton.jit
def _norm_inv(x_ptr, K, norm_k, eps, BLOCK_K: tl.constexpr):
    """1 / rms(x) over K columns, as F.rms_norm: rsqrt(mean(x^2) + eps)."""
    offs_k = tl.arange(0, BLOCK_K)
    ss = tl.zeros([BLOCK_K], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + offs_k
        xv = tl.load(x_ptr + k, mask=k < K, other=0.0).to(tl.float32)
        ss += xv * xv
    return 1.0 / tl.sqrt(tl.sum(ss, axis=0) / norm_k + eps)


@triton.jit
def _x_in(x_ptr, g_ptr, k, k_ok, K, inv, PRO: tl.constexpr, dt: tl.constexpr):
    """The product's input at columns k, in fp32: x through the prologue."""
    a, b = _x_load(x_ptr, g_ptr, k, k_ok, K, PRO)
    return _x_apply(a, b, inv, PRO, dt)


@triton.jit
def _x_load(x_ptr, g_ptr, k, k_ok, K, PRO: tl.constexpr):
    """`_x_in`'s loads (x and the norm weight, gate and up, or x and 0), in their dtype: a kernel can
    issue them before the norm's 1 / rms is known (and hold them in half the registers). PRO_MERGE's
    input comes from `_x_merge` instead (then `_x_apply` rounds it; the tensor-core int4 GEMV loads it
    back from a scratch row, as a plain x)."""
    if PRO == 1:
        return tl.load(x_ptr + k, mask=k_ok, other=0.0), tl.load(g_ptr + k, mask=k_ok, other=0.0)
    elif PRO == 2:
        return tl.load(x_ptr + k, mask=k_ok, other=0.0), tl.load(x_ptr + K + k, mask=k_ok, other=0.0)
    else:
        return tl.load(x_ptr + k, mask=k_ok, other=0.0), 0.0


@triton.jit
def _x_merge(acc_ptr, ml_ptr, k0, K, BK: tl.constexpr, MS: tl.constexpr, MSP: tl.constexpr, MD: tl.constexpr):
    """Attention's output at columns k0 .. k0 + BK ([BK] fp32, before its rounding to the activation
    dtype; BK a multiple of the head width MD), merged here from the MS split partials its kernel left
    (`triton_paged_decode.paged_decode_partials`): acc [MS, K] unnormalized, ml [2, MS, K / MD] each
    split's row maximum and denominator per head. The form of the attention kernel's own merge
    (`triton_splitkv.merge_partials`, every split at once, MSP = next_power_of_2(MS) of them): weights
    exp(m - max) from the maxima, one sum over the splits. All loads are issued at once (one L2 round
    trip) and bypass L1 (.cg): the partials come from the kernel before this one."""
    NH: tl.constexpr = BK // MD
    H = K // MD
    s = tl.arange(0, MSP)
    hh = tl.arange(0, NH)
    d = tl.arange(0, MD)
    s_ok = (s < MS)[:, None]
    row = s[:, None] * H + k0 // MD + hh[None, :]  # [MSP, NH]
    m = tl.load(ml_ptr + row, mask=s_ok, other=-1.0e30, cache_modifier=".cg")
    den_s = tl.load(ml_ptr + MS * H + row, mask=s_ok, other=0.0, cache_modifier=".cg")
    a = tl.load(acc_ptr + (s[:, None, None] * K + k0 + hh[None, :, None] * MD + d[None, None, :]),
                mask=s_ok[:, :, None], other=0.0, cache_modifier=".cg")  # [MSP, NH, MD]
    mx = tl.max(m, axis=0)
    w = tl.exp(m - mx[None, :])  # a split with no visible key (or a padding one) weighs 0
    den = tl.sum(w * den_s, axis=0)
    num = tl.sum(w[:, :, None] * a, axis=0)
    return tl.reshape(num / tl.maximum(den, 1.0e-30)[:, None], [BK])


@triton.jit
def _x_apply(a, b, inv, PRO: tl.constexpr, dt: tl.constexpr):
    """`_x_in`'s prologue on its loads, in fp32."""
    a = a.to(tl.float32)
    if PRO == 1:
        # weight * rms_norm(x).to(dtype): the product of two dtype values, rounded to the dtype
        return ((a * inv).to(dt).to(tl.float32) * b.to(tl.float32)).to(dt).to(tl.float32)
    elif PRO == 2:
        act = (a / (1.0 + tl.exp(-a))).to(dt).to(tl.float32)  # F.silu rounds to the dtype, then * up
        return (act * b.to(tl.float32)).to(dt).to(tl.float32)
    elif PRO == 3:
        return _rnd(a, dt)  # as attention stores its output in the activation dtype
    else:
        return a


@triton.jit
def _dense_rows(w, w_rows, x_ptr, g_ptr, K, eps, norm_k, PRO: tl.constexpr, BLOCK_N: tl.constexpr,
                BLOCK_K: tl.constexpr, VEC: tl.constexpr, dt: tl.constexpr, NORM_BLOCK: tl.constexpr,
                EV: tl.constexpr = ""):
    """sum_k W[rows, k] * prologue(x)[k] in fp32 for a plain [N, K] weight whose rows start at
    w_rows [BLOCK_N, 1] pointers; w: its first [BLOCK_N, BLOCK_K] tile, already loaded (the
    caller issues it before the PDL wait); EV: the weight loads' eviction policy (the caller's)."""
    offs_k = tl.arange(0, BLOCK_K)
    inv = 1.0
    if PRO == 1:
        inv = _norm_inv(x_ptr, K, norm_k, eps, NORM_BLOCK)
    # each thread's VEC adjacent products (one 16-byte load) are added in registers before
    # the running sum: it takes 1/VEC of the registers a [BLOCK_N, BLOCK_K] one would (8 x 1,024
    # tiles at sm_90: 56-94 registers instead of 128-166, so 5-7 programs of 4 warps fit on a
    # multiprocessor instead of 3-4)
    acc = tl.zeros([BLOCK_N, BLOCK_K // VEC], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + offs_k
        # the next tile is loaded before this one is used (the last iteration's load is masked off)
        kn = k + BLOCK_K
        w_next = tl.load(w_rows + kn[None, :], mask=(kn < K)[None, :], other=0.0, eviction_policy=EV)
        xv = _x_in(x_ptr, g_ptr, k, k < K, K, inv, PRO, dt)
        acc += tl.sum(tl.reshape(w.to(tl.float32) * xv[None, :], [BLOCK_N, BLOCK_K // VEC, VEC]), axis=2)
        w = w_next
    return tl.sum(acc, axis=1)


@triton.jit
def _rotate_halves(a, b, c_lo, c_hi, s_lo, s_hi, dt: tl.constexpr):
    """`apply_rope`'s x * cos + roll(x, D/2) * sin_signed on the halves a = x[j], b = x[j + D/2] (fp32 values
    of `dt` entries) -> (rotated x[j], rotated x[j + D/2]) in `dt`, each op rounded to `dt` as eager runs it."""
    lo = _rnd(_rnd(a * c_lo, dt) + _rnd(b * s_lo, dt), dt).to(dt)
    hi = _rnd(_rnd(b * c_hi, dt) + _rnd(a * s_hi, dt), dt).to(dt)
    return lo, hi


@triton.jit
def _rope_kv_epilogue(y, head, j0, cos_ptr, sin_ptr, q_ptr, kp_ptr, vp_ptr, slot_ptr,
                      s_kslot, s_kh, s_vslot, s_vh, n_q, n_qk, HALF: tl.constexpr, P: tl.constexpr):
    """y [2P]: rows j0.. of `head` paired with their partners D/2 further (see the row order), through
    `_rope_kv_store`."""
    a, b = tl.split(tl.reshape(y, [P, 2]))  # a = x[j], b = x[j + D/2]
    hv = head + tl.zeros([P], dtype=tl.int32)  # the head as a vector: masks of the stores' shape
    _rope_kv_store(a, b, j0 + tl.arange(0, P), hv, head, cos_ptr, sin_ptr, q_ptr, kp_ptr, vp_ptr, slot_ptr,
                   s_kslot, s_kh, s_vslot, s_vh, n_q, n_qk, HALF)


@triton.jit
def _rope_kv_store(a, b, d, hv, head, cos_ptr, sin_ptr, q_ptr, kp_ptr, vp_ptr, slot_ptr, s_kslot, s_kh, s_vslot,
                   s_vh, n_q, n_qk, HALF: tl.constexpr):
    """a = x[j], b = x[j + D/2] at rows d of `head` (hv: the head as a vector of their shape). q heads: rotated
    into q_ptr [H * D]; k heads: rotated into the K pool row of this step's slot; v heads: into the V pool as they
    are. The rotation is `apply_rope`'s x * cos + roll(x, D/2) * sin_signed with each op rounded to the dtype, as
    eager runs it. Elementwise ops, loads and stores only, so the Gluon int4 product (`gluon_gemv_w4m`) calls it
    too."""
    dt = q_ptr.dtype.element_ty
    a32, b32 = a.to(tl.float32), b.to(tl.float32)
    c_lo = tl.load(cos_ptr + d).to(tl.float32)
    c_hi = tl.load(cos_ptr + HALF + d).to(tl.float32)
    s_lo = tl.load(sin_ptr + d).to(tl.float32)
    s_hi = tl.load(sin_ptr + HALF + d).to(tl.float32)
    r_lo, r_hi = _rotate_halves(a32, b32, c_lo, c_hi, s_lo, s_hi, dt)
    slot = tl.load(slot_ptr).to(tl.int64)
    is_q = hv < n_q
    is_k = (hv >= n_q) & (hv < n_qk)
    is_v = hv >= n_qk
    q_dst = q_ptr + head * (2 * HALF) + d
    tl.store(q_dst, r_lo, mask=is_q)
    tl.store(q_dst + HALF, r_hi, mask=is_q)
    k_dst = kp_ptr + slot * s_kslot + (head - n_q) * s_kh + d
    tl.store(k_dst, r_lo.to(kp_ptr.dtype.element_ty), mask=is_k)
    tl.store(k_dst + HALF, r_hi.to(kp_ptr.dtype.element_ty), mask=is_k)
    v_dst = vp_ptr + slot * s_vslot + (head - n_qk) * s_vh + d
    tl.store(v_dst, a.to(vp_ptr.dtype.element_ty), mask=is_v)
    tl.store(v_dst + HALF, b.to(vp_ptr.dtype.element_ty), mask=is_v)


@triton.jit
def _rms_norm_row_kernel(x_ptr, g_ptr, y_ptr, K, norm_k, eps, BLOCK_K: tl.constexpr, PDL: tl.constexpr):
    """y = weight * rms_norm(x) for one row, rounded as the `norm` prologue rounds it."""
    if PDL:
        tl.extra.cuda.gdc_wait()  # x comes from the kernel before
    dt = y_ptr.dtype.element_ty
    inv = _norm_inv(x_ptr, K, norm_k, eps, BLOCK_K)
    offs_k = tl.arange(0, BLOCK_K)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + offs_k
        ok = k < K
        tl.store(y_ptr + k, _x_in(x_ptr, g_ptr, k, ok, K, inv, 1, dt).to(dt), mask=ok)


def rms_norm_row(x: torch.Tensor, weight: torch.Tensor, eps: float, pdl: bool | None = None) -> torch.Tensor:
    """x [1, K] -> weight * rms_norm(x) [1, K] in one kernel, with the `norm` prologue's rounding (the
    normalised x rounded to x's dtype, then the product with the weight): the model's final norm
    in a one-token GPU step (`fused_decode.final_norm`), where the unfused module takes four."""
    if x.dim() != 2 or x.shape[0] != 1 or weight.shape != (x.shape[1],) or weight.dtype != x.dtype:
        raise ValueError(f"rms_norm_row: x [1, K] and a weight [K] of its dtype, got {tuple(x.shape)} "
                         f"{x.dtype} and {tuple(weight.shape)} {weight.dtype}")
    x = x.contiguous()
    y = torch.empty_like(x)
    K = x.shape[1]
    pdl = pdl_enabled(x.device) if pdl is None else pdl
    _rms_norm_row_kernel[(1,)](x, weight.contiguous(), y, K, float(K), float(eps),
                               BLOCK_K=min(4096, triton.next_power_of_2(K)), PDL=pdl, num_warps=4,
                               **({"launch_pdl": True} if pdl else {}))
    return y


# One opaque node for torch.compile, so a compiled one-token step normalizes with the same kernel (and
# bits) as an eager one.
@torch.library.custom_op("augury::rms_norm_row", mutates_args=(), schema="(Tensor x, Tensor weight, float eps) -> Tensor")
def rms_norm_row_op(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return rms_norm_row(x, weight, eps)


@rms_norm_row_op.register_fake
def _(x, weight, eps):
    return torch.empty_like(x)


def fused_rms_norm_row(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """`rms_norm_row`, through the custom op while torch.compile traces."""
    if torch.compiler.is_compiling():
        return rms_norm_row_op(x, weight, eps)
    return rms_norm_row(x, weight, eps)


def _weight(w: torch.Tensor, scales_zeros: torch.Tensor | None, group_size: int) -> tuple[int, int, dict | None]:
    """(N, K, int4) for a plain [N, K] weight (scales_zeros None; int4 None) or an int4 one as
    `Int4Linear` keeps it on CUDA: tinygemm's packed int32 [N / 8, K / (16 T), 32, T / 2]
    (`augury.layers.int4_layout`) with its bf16 (scale, zero) pairs [K / group_size, N, 2], or those
    pairs transposed to int32 [N, K / group_size] (`int4_layout.transpose_scales`)."""
    if scales_zeros is None:
        if w.dim() != 2:
            raise ValueError(f"gemv: a plain weight is [N, K], got {tuple(w.shape)} (an int4 weight needs its scales)")
        return w.shape[0], w.shape[1], None
    if w.dim() == 3 and w.dtype == torch.int32 and w.shape[2] == 512 and w.is_contiguous():  # `triton_gemv_w4m.pack`
        kb, nt = w.shape[0], w.shape[1]
        if group_size != 32 or scales_zeros.dtype != torch.int32 or scales_zeros.shape != (kb, nt, 128) \
                or not scales_zeros.is_contiguous():
            raise ValueError(f"gemv: an mma-layout int4 weight takes group 32 and its contiguous int32 scales "
                             f"[{kb}, {nt}, 128] (triton_gemv_w4m.pack), got group {group_size}, "
                             f"{scales_zeros.dtype} {tuple(scales_zeros.shape)}")
        return 16 * nt, 256 * kb, dict(scales=scales_zeros, group_size=32, ikt=0, transposed=True, layout="mma")
    if w.dim() == 2 and w.dtype == torch.int32 and w.is_contiguous():  # `triton_gemv_w4r.pack`'s layout
        n, k, ikt, layout = w.shape[0], 8 * w.shape[1], 0, "rows"
    elif w.dim() == 4 and w.dtype == torch.int32 and w.shape[2] == 32 and 2 * w.shape[3] in (2, 4, 8) \
            and w.is_contiguous():
        ikt, layout = 2 * w.shape[3], "tinygemm"
        n, k = 8 * w.shape[0], 16 * ikt * w.shape[1]
    else:
        raise ValueError(f"gemv: an int4 weight is tinygemm's contiguous int32 [N/8, K/(16T), 32, T/2], the "
                         f"row-major int32 [N, K/8] of triton_gemv_w4r.pack or the int32 [K/256, N/16, 512] of "
                         f"triton_gemv_w4m.pack, got {w.dtype} {tuple(w.shape)}")
    if group_size not in (32, 64, 128, 256) or k % group_size:
        raise ValueError(f"gemv: int4 groups are 32-256 columns dividing K={k}, got {group_size}")
    g = k // group_size
    if scales_zeros.dtype == torch.int32 and scales_zeros.shape == (n, g):
        transposed = True  # `Int4Linear.gemv_scales`: a row's consecutive groups are one vector load
    elif layout == "rows":
        raise ValueError(f"gemv: a row-major int4 weight takes int32 scales [{n}, {g}] (triton_gemv_w4r.pack), got "
                         f"{scales_zeros.dtype} {tuple(scales_zeros.shape)} at group {group_size}")
    elif scales_zeros.dtype == torch.bfloat16 and scales_zeros.shape == (g, n, 2):
        transposed, scales_zeros = False, scales_zeros.view(torch.int32).view(g, n)  # tinygemm's, in place
    else:
        raise ValueError(f"gemv: int4 scales are tinygemm's bf16 (scale, zero) pairs [{g}, {n}, 2] or the pairs "
                         f"transposed to int32 [{n}, {g}] (int4_layout.transpose_scales), got "
                         f"{scales_zeros.dtype} {tuple(scales_zeros.shape)} at group {group_size}")
    if not scales_zeros.is_contiguous():
        raise ValueError("gemv: int4 scales must be contiguous")
    return n, k, dict(scales=scales_zeros, group_size=group_size, ikt=ikt, transposed=transposed, layout=layout)


def gemv(x: torch.Tensor, w: torch.Tensor, *, norm_weight: torch.Tensor | None = None, eps: float = 1e-6,
         silu_mul: bool = False, residual: torch.Tensor | None = None,
         scales_zeros: torch.Tensor | None = None, group_size: int = 0, merge_ml: torch.Tensor | None = None,
         cfg=None, pdl: bool | None = None, early_weights: bool = True) -> torch.Tensor:
    """x [1, K_in] -> [1, N] = W @ prologue(x) (+ residual).

    norm_weight: x is RMS-normalised over its K columns and scaled by norm_weight [K] first.
    silu_mul: x is [1, 2K] = [gate; up] and the product reads silu(gate) * up (K = w's columns).
    merge_ml: x is attention's output left as S split partials, float32 [S, K] with their row maxima
    and denominators merge_ml [2, S, H] (`triton_paged_decode.paged_decode_partials`); the prologue
    merges them and rounds to the output's dtype (the residual's, else the weight's, int4: bf16) as
    attention would have. Plain and mma-layout int4 weights only.
    residual: [1, N], added to the rounded product.
    scales_zeros / group_size: w is an int4 weight in tinygemm's layout (see `_weight`).
    cfg: a `GemvConfig`, or for int4 a `triton_gemv_w4.W4SplitConfig`.
    early_weights: under PDL, the first weight tile is loaded before waiting for the previous
    kernel (default); False waits first (benchmarks: in the H200 layer chain the early tiles
    save ~2.5 us a layer, `augury.bench.gemv_gpu`)."""
    if (norm_weight is not None) + silu_mul + (merge_ml is not None) > 1:
        raise ValueError("gemv: one prologue at a time (norm, silu_mul or merge_ml)")
    N, K, w4 = _weight(w, scales_zeros, group_size)
    if x.shape[-1] != (2 * K if silu_mul else K):
        raise ValueError(f"gemv: x has {x.shape[-1]} columns, weight [{N}, {K}] needs "
                         f"{2 * K if silu_mul else K}")
    x = x.contiguous()
    dtype = x.dtype
    merge = {}
    if merge_ml is not None:
        dtype = residual.dtype if residual is not None else (torch.bfloat16 if w4 is not None else w.dtype)
        merge = _merge_consts(x, merge_ml, K, w4)
    y = torch.empty((1, N), dtype=dtype, device=x.device)
    pro = PRO_NORM if norm_weight is not None else PRO_SILU_MUL if silu_mul else PRO_MERGE if merge else PRO_NONE
    r = residual.contiguous() if residual is not None else y
    g = norm_weight.contiguous() if norm_weight is not None else merge_ml.contiguous() if merge else x
    _launch(cfg, pdl, w4, (x, g, w, r, y, N, K, w.stride(0), float(eps), float(K), x, x, x, x, x, 0, 0, 0, 0, 0, 0),
            early_weights=early_weights, PRO=pro, RESIDUAL=residual is not None, ROPE_KV=False, HALF=1, **merge)
    return y


def _merge_consts(x: torch.Tensor, ml: torch.Tensor, K: int, w4: dict | None) -> dict:
    """The PRO_MERGE kernels' constants (MS splits, MD head width) for partials x [S, K] and ml [2, S, H]."""
    if w4 is not None and w4["layout"] != "mma":
        raise ValueError(f"gemv: merge_ml takes plain or mma-layout int4 weights, not the {w4['layout']} layout")
    if x.dtype != torch.float32 or x.dim() != 2 or ml.dtype != torch.float32 or ml.dim() != 3 \
            or ml.shape[:2] != (2, x.shape[0]) or K % ml.shape[2]:
        raise ValueError(f"gemv: merge_ml needs float32 partials [S, {K}] and their float32 statistics [2, S, H] "
                         f"with H dividing {K}, got {x.dtype} {tuple(x.shape)} and {ml.dtype} {tuple(ml.shape)}")
    return {"MS": x.shape[0], "MD": K // ml.shape[2]}


def _launch(cfg, pdl: bool | None, w4: dict | None, args: tuple, early_weights: bool = True, **consts) -> None:
    """`_gemv_kernel` over N / block_n programs with the launch parameters of `cfg`, under PDL where
    it is enabled for the device (args[0] is x) unless `pdl` says otherwise; int4 weights (w4) go
    to the split-K kernel of `triton_gemv_w4` (cfg: its `W4SplitConfig`). early_weights: see `gemv`
    (plain weights only)."""
    pdl = pdl_enabled(args[0].device) if pdl is None else pdl
    if w4 is not None:
        from augury.layers import triton_gemv_w4, triton_gemv_w4r  # they import this module's helpers

        x, g, w, r, y, n, k = args[:7]
        if w4["layout"] == "mma":
            from augury.layers import triton_gemv_w4m

            if cfg is not None and not isinstance(cfg, triton_gemv_w4m.W4MmaConfig):
                raise ValueError("gemv: mma-layout int4 weights take a triton_gemv_w4m.W4MmaConfig")
            triton_gemv_w4m.launch(x, g, w, w4["scales"], r, y, n, k, args[8], args[10:], pro=consts["PRO"],
                                   residual=consts["RESIDUAL"], rope_kv=consts["ROPE_KV"], half=consts["HALF"],
                                   cfg=cfg, pdl=pdl, merge=(consts.get("MS", 1), consts.get("MD", 1)))
            return
        if w4["layout"] == "rows":
            if cfg is not None and not isinstance(cfg, triton_gemv_w4r.W4RowsConfig):
                raise ValueError("gemv: row-major int4 weights take a triton_gemv_w4r.W4RowsConfig")
            triton_gemv_w4r.launch(x, g, w, w4["scales"], r, y, n, k, args[8], args[10:], pro=consts["PRO"],
                                   residual=consts["RESIDUAL"], rope_kv=consts["ROPE_KV"], half=consts["HALF"],
                                   group_size=w4["group_size"], cfg=cfg, pdl=pdl)
            return
        if cfg is not None and not isinstance(cfg, triton_gemv_w4.W4SplitConfig):
            raise ValueError("gemv: int4 weights take a triton_gemv_w4.W4SplitConfig")
        triton_gemv_w4.launch(x, g, w, w4["scales"], r, y, n, k, args[8], args[10:], pro=consts["PRO"],
                              residual=consts["RESIDUAL"], rope_kv=consts["ROPE_KV"], half=consts["HALF"],
                              group_size=w4["group_size"], ikt=w4["ikt"], cfg=cfg, pdl=pdl,
                              transposed=w4["transposed"])
        return
    n, k = args[5], args[6]
    if consts["PRO"] == PRO_MERGE:  # each program merges only its K slice's partials: the split-K GEMV
        from augury.layers.triton_gemv_split import SplitConfig, gemv_split

        if cfg is not None and not isinstance(cfg, SplitConfig):
            raise ValueError("gemv: a plain weight with merge_ml takes a triton_gemv_split.SplitConfig")
        x, g, w, r, y = args[:5]
        gemv_split(x, w, y, residual=r if consts["RESIDUAL"] else None, merge_ml=g,
                   merge={"MS": consts["MS"], "MD": consts["MD"]}, cfg=cfg, pdl=pdl)
        return
    cfg = cfg or default_config(n, k)
    if not isinstance(cfg, GemvConfig):
        raise ValueError("gemv: a plain weight takes a GemvConfig")
    if cfg.weight_cache not in (0, 2):
        raise ValueError(f"gemv: GemvConfig.weight_cache is 0 (no hint) or 2 (evict-first), got {cfg}")
    _gemv_kernel[(triton.cdiv(n, cfg.block_n),)](
        *args, **consts, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, EVEN_K=k % cfg.block_k == 0, PDL=pdl,
        VEC=min(cfg.block_k, 16 // args[2].element_size()),  # the elements of one 16-byte load
        EARLY_W=early_weights, NORM_BLOCK=norm_block(cfg.block_k, k), LATE_LAUNCH=cfg.late_launch, WC=cfg.weight_cache,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, **({"launch_pdl": True} if pdl else {}),
    )


def qkv_rope_kv(x: torch.Tensor, w: torch.Tensor, *, norm_weight: torch.Tensor, eps: float,
                cos: torch.Tensor, sin: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor,
                slot: torch.Tensor, num_heads: int, num_kv_heads: int,
                scales_zeros: torch.Tensor | None = None, group_size: int = 0,
                cfg=None, pdl: bool | None = None, early_weights: bool = True) -> torch.Tensor:
    """The qkv projection of one token with everything up to attention in its epilogue:
    x [1, hidden] -> q [1, H * D], rope applied; this token's K (rope applied) and V are written
    into row `slot[0]` of k_pool / v_pool [num_slots, Hkv, D] (what `paged_attention` does with
    index_copy_ before it reads the pools). w is the fused [q; k; v] weight [(H + 2 Hkv) D, hidden]
    (or its int4 form, as for `gemv`); the input norm is the prologue, as for
    `gemv(norm_weight=...)`. cos / sin_signed: this position's rope rows [D] (`RotaryEmbedding`),
    in x's dtype. early_weights: as for `gemv`."""
    N, K, w4 = _weight(w, scales_zeros, group_size)
    heads = num_heads + 2 * num_kv_heads
    D = N // heads
    if cfg is None and w4 is None:
        cfg = default_config(N, K)
        if D % cfg.block_n:  # rows go in rope pairs within a head: 8-row blocks fit any D % 8 == 0
            cfg = replace(cfg, block_n=8)
    block = 8 if w4 is not None else cfg.block_n  # int4: the split kernel takes whole heads, D % 8 == 0
    if N != heads * D or D % block or block % 2:
        raise ValueError(f"qkv_rope_kv: weight rows {N} are not {heads} heads of a head_dim that splits "
                         f"into {block}-row blocks")
    if x.shape[-1] != K or cos.numel() != D or sin.numel() != D:
        raise ValueError("qkv_rope_kv: x, cos or sin does not match the weight")
    for pool in (k_pool, v_pool):
        if pool.dim() != 3 or pool.shape[1:] != (num_kv_heads, D) or pool.stride(-1) != 1:
            raise ValueError(f"qkv_rope_kv: pools must be [slots, {num_kv_heads}, {D}] with unit stride")
    x = x.contiguous()
    q = torch.empty((1, num_heads * D), dtype=x.dtype, device=x.device)
    _launch(cfg, pdl, w4,
            (x, norm_weight.contiguous(), w, q, q, N, K, w.stride(0), float(eps), float(K),
             cos.contiguous(), sin.contiguous(), k_pool, v_pool, slot, k_pool.stride(0), k_pool.stride(1),
             v_pool.stride(0), v_pool.stride(1), num_heads, num_heads + num_kv_heads),
            early_weights=early_weights, PRO=PRO_NORM, RESIDUAL=False, ROPE_KV=True, HALF=D // 2)
    return q


def _rows_of(w: torch.Tensor, scales_zeros: torch.Tensor | None) -> int:
    if scales_zeros is not None and w.dim() == 3:  # `triton_gemv_w4m.pack`: [K / 256, N / 16, 512]
        return 16 * w.shape[1]
    return w.shape[0] if scales_zeros is None or w.dim() == 2 else 8 * w.shape[0]


@torch.library.custom_op(
    "augury::qkv_rope_kv", mutates_args=("k_pool", "v_pool"),
    schema="(Tensor x, Tensor w, Tensor norm_weight, float eps, Tensor cos, Tensor sin, Tensor(a!) k_pool, "
           "Tensor(b!) v_pool, Tensor slot, int num_heads, int num_kv_heads, Tensor? scales_zeros, "
           "int group_size) -> Tensor")
def qkv_rope_kv_op(x: torch.Tensor, w: torch.Tensor, norm_weight: torch.Tensor, eps: float, cos: torch.Tensor,
                   sin: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, slot: torch.Tensor,
                   num_heads: int, num_kv_heads: int, scales_zeros: torch.Tensor | None,
                   group_size: int) -> torch.Tensor:
    return qkv_rope_kv(x, w, norm_weight=norm_weight, eps=eps, cos=cos, sin=sin, k_pool=k_pool, v_pool=v_pool,
                       slot=slot, num_heads=num_heads, num_kv_heads=num_kv_heads, scales_zeros=scales_zeros,
                       group_size=group_size)


@qkv_rope_kv_op.register_fake
def _(x, w, norm_weight, eps, cos, sin, k_pool, v_pool, slot, num_heads, num_kv_heads, scales_zeros, group_size):
    return x.new_empty((1, num_heads * (_rows_of(w, scales_zeros) // (num_heads + 2 * num_kv_heads))))


def fused_qkv_rope_kv(x: torch.Tensor, w: torch.Tensor, *, norm_weight: torch.Tensor, eps: float,
                      cos: torch.Tensor, sin: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor,
                      slot: torch.Tensor, num_heads: int, num_kv_heads: int,
                      scales_zeros: torch.Tensor | None = None, group_size: int = 0) -> torch.Tensor:
    """`qkv_rope_kv`, through the custom op while torch.compile traces."""
    if torch.compiler.is_compiling():
        return qkv_rope_kv_op(x, w, norm_weight, eps, cos, sin, k_pool, v_pool, slot, num_heads, num_kv_heads,
                              scales_zeros, group_size)
    return qkv_rope_kv(x, w, norm_weight=norm_weight, eps=eps, cos=cos, sin=sin, k_pool=k_pool, v_pool=v_pool,
                       slot=slot, num_heads=num_heads, num_kv_heads=num_kv_heads, scales_zeros=scales_zeros,
                       group_size=group_size)


# One opaque node for torch.compile (dynamo cannot trace Triton's launcher); eager calls go
# straight to `gemv`. Optional tensors are passed as real ones or None.
@torch.library.custom_op(
    "augury::gemv", mutates_args=(),
    schema="(Tensor x, Tensor w, Tensor? norm_weight, float eps, bool silu_mul, Tensor? residual, "
           "Tensor? scales_zeros, int group_size, Tensor? merge_ml) -> Tensor")
def gemv_op(x: torch.Tensor, w: torch.Tensor, norm_weight: torch.Tensor | None, eps: float, silu_mul: bool,
            residual: torch.Tensor | None, scales_zeros: torch.Tensor | None, group_size: int,
            merge_ml: torch.Tensor | None) -> torch.Tensor:
    return gemv(x, w, norm_weight=norm_weight, eps=eps, silu_mul=silu_mul, residual=residual,
                scales_zeros=scales_zeros, group_size=group_size, merge_ml=merge_ml)


@gemv_op.register_fake
def _(x, w, norm_weight, eps, silu_mul, residual, scales_zeros, group_size, merge_ml):
    if merge_ml is None:
        return x.new_empty((1, _rows_of(w, scales_zeros)))
    dtype = residual.dtype if residual is not None else (torch.bfloat16 if scales_zeros is not None else w.dtype)
    return x.new_empty((1, _rows_of(w, scales_zeros)), dtype=dtype)


def fused_gemv(x: torch.Tensor, w: torch.Tensor, *, norm_weight: torch.Tensor | None = None,
               eps: float = 1e-6, silu_mul: bool = False, residual: torch.Tensor | None = None,
               scales_zeros: torch.Tensor | None = None, group_size: int = 0,
               merge_ml: torch.Tensor | None = None) -> torch.Tensor:
    """`gemv`, through the custom op while torch.compile traces."""
    if torch.compiler.is_compiling():
        return gemv_op(x, w, norm_weight, eps, silu_mul, residual, scales_zeros, group_size, merge_ml)
    return gemv(x, w, norm_weight=norm_weight, eps=eps, silu_mul=silu_mul, residual=residual,
                scales_zeros=scales_zeros, group_size=group_size, merge_ml=merge_ml)
