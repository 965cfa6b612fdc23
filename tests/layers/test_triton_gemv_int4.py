"""The one-row split-K GEMV on int4 weights in tinygemm's layout (`triton_gemv_w4`) equals the
dequantized product; a fused Llama layer with `Int4Linear` projections equals its unfused ops,
eager and compiled.

Runs under TRITON_INTERPRET=1 on the CPU (small shapes); on a CUDA machine the same checks run
compiled, plus the 8B shapes against tinygemm and a captured CUDA graph."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tests.triton_env import interpreter, rerun_in_fresh_process  # noqa: E402

CPU, FRESH = interpreter()

from augury.layers import fused_decode, int4_layout  # noqa: E402
from augury.layers.quant_linear import Int4Linear, dequantize_int4, quantize_int4  # noqa: E402
from augury.layers import triton_gemv_w4  # noqa: E402
from augury.layers.triton_gemv import GemvConfig, gemv, qkv_rope_kv  # noqa: E402
from augury.layers.triton_gemv_w4 import W4SplitConfig as W4  # noqa: E402

here = pytest.mark.skipif(not FRESH, reason="triton was imported before the interpreter was on: test_in_fresh_process runs these")
cuda_only = pytest.mark.skipif(CPU, reason="needs a CUDA device")
DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")


@pytest.fixture(autouse=True)
def _int4_gemv_on(monkeypatch):
    """The int4 GEMV route is opt-in (AUGURY_INT4_GEMV=1); these tests turn it on, on tinygemm's bytes
    (AUGURY_INT4_GEMV_LAYOUT=tinygemm: the row layout has its own tests, test_triton_gemv_w4r.py)."""
    from augury.layers import quant_linear

    monkeypatch.setattr(quant_linear, "_INT4_GEMV_ON", True)
    monkeypatch.setattr(quant_linear, "_INT4_GEMV_LAYOUT", "tinygemm")


def _rand(*shape, seed=0, dtype=torch.float32, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale).to(DEV, dtype)


def _int4(n, k, gs, t, seed):
    """-> (packed, scales, w): a random weight's int4 form in tinygemm's layout with T = t inner
    k-tiles, its (scale, zero) pairs transposed to int32 [N, G] (what the GEMV reads,
    `Int4Linear.gemv_scales`), and the fp32 weight it stands for (scale/zero rounded to bf16)."""
    w = _rand(n, k, seed=seed, scale=0.1).float().cpu()
    q, s, z = quantize_int4(w, gs)
    sz = torch.stack([s.T, z.T], -1).to(torch.bfloat16).contiguous()
    return (int4_layout.pack(q, t).to(DEV), int4_layout.transpose_scales(sz).to(DEV),
            dequantize_int4(q, s, z, gs).to(DEV))


def _close(y, ref, dtype):
    y, ref = y.float(), ref.float()
    if dtype == torch.float32:  # the same fp32 products, summed in another order
        torch.testing.assert_close(y, ref, atol=1e-5 * ref.abs().max().item(), rtol=1e-5)
    else:
        torch.testing.assert_close(y, ref, atol=2 ** -6 * ref.abs().max().item(), rtol=0)


def _untransposed(sz):
    """int32 [N, G] transposed pairs -> tinygemm's bf16 [G, N, 2]."""
    return sz.T.contiguous().view(torch.bfloat16).view(sz.shape[1], sz.shape[0], 2)


# (T, group, N, K, config): several K slices, a ragged last slice (super-tiles past K masked), a
# slice wider than K; several row tiles per chunk, a ragged last chunk; groups wider than a word's
# 32-column block and than a super-tile; row tiles pipelined through shared memory (stages > 1,
# ragged chunks included); the shape-based default
CASES = [(2, 32, 16, 128, W4(8, 2, 16, 4)), (2, 32, 24, 96, W4(8, 2, 16, 4, stages=3)), (2, 32, 16, 64, W4(8, 4, 16, 4)),
         (4, 128, 16, 256, W4(8, 1, 16, 4)), (8, 64, 8, 256, W4(8, 2, 8, 4)), (4, 32, 16, 256, W4(16, 4, 16, 2)),
         (8, 32, 16, 512, W4(8, 2, 16, 4, stages=2)), (8, 256, 8, 512, W4(8, 1, 8, 4)), (8, 32, 40, 1024, None),
         (4, 32, 40, 512, W4(8, 2, 32, 4, stages=4)),
         # the 8B defaults' launch parameters (gate_up's, the LM head's) on a small ragged weight
         (8, 32, 72, 512, W4(64, 2, 1024, 8)), (8, 32, 40, 1024, W4(32, 2, 1024, 4)),
         (2, 32, 16, 128, W4(8, 2, 16, 4, late_launch=True))]


@here
@pytest.mark.parametrize("t,gs,n,k,cfg", CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("transposed", [True, False])  # Int4Linear.gemv_scales, or tinygemm's pairs in place
def test_product_with_each_prologue_equals_the_dequantized_weight(t, gs, n, k, cfg, dtype, transposed):
    packed, sz, w = _int4(n, k, gs, t, seed=t + n)
    if not transposed:
        sz = _untransposed(sz)
    x = _rand(1, k, seed=1, dtype=dtype, scale=2.0)
    _close(gemv(x, packed, scales_zeros=sz, group_size=gs, cfg=cfg), F.linear(x.float(), w), dtype)
    # norm prologue + residual epilogue
    g, r = _rand(k, seed=2, dtype=dtype), _rand(1, n, seed=3, dtype=dtype)
    xn = (g * F.rms_norm(x.float(), (k,), None, 1e-5).to(dtype)).to(dtype)
    ref = (F.linear(xn.float(), w).to(dtype).float() + r.float())
    _close(gemv(x, packed, scales_zeros=sz, group_size=gs, norm_weight=g, eps=1e-5, residual=r, cfg=cfg), ref, dtype)
    # silu_mul prologue
    gu = _rand(1, 2 * k, seed=4, dtype=dtype)
    act = (F.silu(gu[:, :k]) * gu[:, k:]).to(dtype)
    _close(gemv(gu, packed, scales_zeros=sz, group_size=gs, silu_mul=True, cfg=cfg), F.linear(act.float(), w), dtype)


@here
def test_counters_reset_and_the_workspace_is_reused():
    """The last program of a chunk resets its counter: a second call (or a graph replay) reduces
    from zero and needs no clearing; the partials buffer is shared, not reallocated."""
    packed, sz, w = _int4(24, 96, 32, 2, seed=16)
    cfg = W4(8, 1, 16, 4)  # 2 chunks x 3 slices
    bufs = set()
    for seed in (17, 18):
        x = _rand(1, 96, seed=seed)
        _close(gemv(x, packed, scales_zeros=sz, group_size=32, cfg=cfg), F.linear(x.float(), w), torch.float32)
        ws, cnt = triton_gemv_w4._workspace(x.device, 0, 0)
        assert not cnt.any()
        bufs.add((ws.data_ptr(), cnt.data_ptr()))
    assert len(bufs) == 1


def test_the_workspace_grows_and_keeps_what_it_outgrew():
    """A larger call reallocates (keeping the old buffers: a captured graph may point at them);
    smaller calls reuse the largest."""
    dev = torch.device("cpu")
    triton_gemv_w4._WORKSPACE.pop(str(dev), None)
    ws, cnt = triton_gemv_w4._workspace(dev, 10, 3)
    assert ws.numel() >= 10 and cnt.numel() >= 3 and not cnt.any()
    assert triton_gemv_w4._workspace(dev, 5, 2)[0] is ws
    retired = len(triton_gemv_w4._RETIRED)
    big, _ = triton_gemv_w4._workspace(dev, ws.numel() + 1, 3)
    assert big.numel() > ws.numel() and len(triton_gemv_w4._RETIRED) == retired + 2
    assert triton_gemv_w4._workspace(dev, 10, 3)[0] is big


@here
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_every_nibble_value_and_extreme_inputs_are_exact(dtype):
    """Both decodes are exact for q = 0..15 at every nibble position: fp32 inputs take the
    magic-mantissa fp32 decode (`_q8o`), whose 2^(23 - 4b) input scaling neither overflows nor
    loses bits for large or tiny x; bf16 inputs the fp16x2 products (`_half2_dot`: the PTX on a GPU,
    its fp16 stand-in under the interpreter), whose per-slice power-of-two scaling brings any x into
    fp16's range. Each column's q differs from those of the columns a nibble or a nibble pair
    away, so an input paired with the wrong nibble shows."""
    n, k, gs = 16, 64, 32
    r, c = torch.arange(n)[:, None], torch.arange(k)[None, :]
    q = ((r + c + 5 * (c // 8)) % 16).to(torch.uint8)  # every value at every position, per row
    s = torch.full((n, 2), 0.5).to(torch.bfloat16).float()
    z = torch.full((n, 2), 0.25).to(torch.bfloat16).float()
    packed = int4_layout.pack(q, 2).to(DEV)
    sz = int4_layout.transpose_scales(torch.stack([s.T, z.T], -1).to(torch.bfloat16).contiguous()).to(DEV)
    w = dequantize_int4(q, s, z, gs).to(DEV)
    scales = (1.0, 2.0 ** 10, 2.0 ** -10) if dtype == torch.float16 else (1.0, 2.0 ** 100, 2.0 ** -100)
    for scale in scales:  # powers of two: every product is exact
        for c in range(32):  # one column at a time: y = w[:, c] * x_c, exact in fp32
            x = torch.zeros(1, k, device=DEV, dtype=dtype)
            x[0, c] = scale
            y = gemv(x, packed, scales_zeros=sz, group_size=gs, cfg=W4(8, 1, 16, 4))  # 2 slices
            assert torch.equal(y, F.linear(x.double(), w.double()).to(dtype)), (scale, c)


@here
@pytest.mark.parametrize("scale", [1.0, 2.0 ** 100, 2.0 ** -100])
def test_half2_products_hold_outliers_and_any_magnitude(scale):
    """bf16 inputs at any overall magnitude, plain and spanning 2^25 (an outlier among unit
    values, as in real activations): every product within fp16's rounding of the exact sum of
    |w x|. Without outliers that bound is ~16x below the result, so inputs scaled out of fp16's
    range (overflowing to inf, or flushed towards zero) fail it."""
    n, k, gs = 16, 256, 32
    packed, sz, w = _int4(n, k, gs, 4, seed=21)
    plain = _rand(1, k, seed=22)
    spread = plain.clone()
    spread[0, 5], spread[0, 77], spread[0, 200] = 30000.0, -1e-3, -900.0
    for x in (plain, spread):
        x = (x * scale).to(torch.bfloat16)
        ref = F.linear(x.double(), w.double())
        bound = F.linear(x.double().abs(), w.double().abs())
        for cfg in (W4(8, 1, 16, 4), W4(8, 4, 16, 4, half2=False)):  # 4 slices / 1; fp16x2 / the fp32 decode
            y = gemv(x, packed, scales_zeros=sz, group_size=gs, cfg=cfg).double()
            assert torch.isfinite(y).all()
            torch.testing.assert_close(y, ref, atol=2 ** -8 * bound.max().item(), rtol=0)


def qkv_rope_kv_against_its_parts(packed, sz, gs, H, Hkv, D, hidden, dtype, cfg, seed):
    """qkv_rope_kv on this int4 weight, and the same product through `gemv` with rope applied and the
    pools written as eager does: asserts the V pool and the K pool's other slots match, returns
    (q, the eager q/k rotated, k_pool, k_ref) for the caller's check of q and of the written K row."""
    from augury.config import RopeConfig
    from augury.layers.rope import RotaryEmbedding, apply_rope

    x, g = _rand(1, hidden, seed=seed, dtype=dtype, scale=2.0), _rand(hidden, seed=seed + 1, dtype=dtype)
    cos, sin = RotaryEmbedding(RopeConfig(theta=500000.0), D, 64, device=DEV, dtype=dtype)(torch.tensor([9], device=DEV))
    k_pool = torch.full((6, Hkv, D), 7.0, device=DEV, dtype=dtype)
    v_pool = torch.full((6, Hkv, D), 7.0, device=DEV, dtype=dtype)
    k_ref, v_ref = k_pool.clone(), v_pool.clone()
    slot = torch.tensor([4], device=DEV)
    q = qkv_rope_kv(x, packed, scales_zeros=sz, group_size=gs, norm_weight=g, eps=1e-5, cos=cos, sin=sin,
                    k_pool=k_pool, v_pool=v_pool, slot=slot, num_heads=H, num_kv_heads=Hkv, cfg=cfg)
    qkv = gemv(x, packed, scales_zeros=sz, group_size=gs, norm_weight=g, eps=1e-5, cfg=cfg).view(1, H + 2 * Hkv, D)
    qk = apply_rope(qkv[:, : H + Hkv], cos, sin)
    k_ref.index_copy_(0, slot, qk[:, H:])
    v_ref.index_copy_(0, slot, qkv[:, H + Hkv:])
    assert torch.equal(v_pool, v_ref) and torch.equal(k_pool[:4], k_ref[:4]) and torch.equal(k_pool[5:], k_ref[5:])
    return q, qk, k_pool, k_ref


@here
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("gs,transposed", [(32, True), (64, False)])
def test_qkv_rope_kv_on_int4_equals_its_product_rope_and_pool_write(dtype, gs, transposed):
    H, Hkv, D, hidden = 4, 2, 16, 64
    packed, sz, _ = _int4((H + 2 * Hkv) * D, hidden, gs, 2, seed=5)
    if not transposed:
        sz = _untransposed(sz)
    cfg = W4(8, 1, 32, 4)  # chunks of 2 heads, 2 K slices
    q, qk, k_pool, k_ref = qkv_rope_kv_against_its_parts(packed, sz, gs, H, Hkv, D, hidden, dtype, cfg, seed=6)
    if dtype == torch.float32 and not CPU:  # compiled fp32 may contract the rotation into an FMA
        torch.testing.assert_close(q.view(1, H, D), qk[:, :H], atol=1e-5, rtol=1e-5)
    else:  # a row's sum does not depend on the rows it shares a program with: bitwise
        assert torch.equal(q.view(1, H, D), qk[:, :H]) and torch.equal(k_pool[4], k_ref[4])


def _tinygemm_layout(lin: Int4Linear) -> Int4Linear:
    """Re-pack a CPU Int4Linear's weight in tinygemm's CUDA layout, as `.cuda()` leaves it (under
    the interpreter the fused path reads it on the CPU; its own forward is never called)."""
    if lin._layout != "cuda":
        q = lin.unpack()
        lin._layout, lin._native, lin.native_scales = "cuda", False, None
        lin.packed = int4_layout.pack(q, lin._inner_k_tiles).to(lin.scales_zeros.device)
        lin._pack_native_scales()  # the GEMV's transposed scales (group 32)
    return lin


def _tiny_int4_llama(hidden=64, inter=96):
    """(int4 model, its twin with the dequantized weights as bf16 nn.Linear): a tiny bf16 Llama."""
    from tests.layers.test_triton_gemv import _tiny_llama

    m, ref = _tiny_llama(torch.bfloat16, hidden, inter), _tiny_llama(torch.bfloat16, hidden, inter)
    for layer, rlayer in zip(m.layers, ref.layers):
        for owner, rowner, name in (("self_attn", "self_attn", "qkv_proj"), ("self_attn", "self_attn", "o_proj"),
                                    ("mlp", "mlp", "gate_up_proj"), ("mlp", "mlp", "down_proj")):
            lin = getattr(getattr(layer, owner), name)
            q4 = Int4Linear.from_linear(lin.cpu() if CPU else lin, 32)
            if not CPU:
                q4 = q4.to(DEV)
                q4(torch.zeros(1, q4.in_features, device=DEV, dtype=torch.bfloat16))  # packs for CUDA
            setattr(getattr(layer, owner), name, _tinygemm_layout(q4))
            dense = nn.Linear(lin.in_features, lin.out_features, bias=False, device=DEV, dtype=torch.bfloat16)
            with torch.no_grad():
                dense.weight.copy_(q4.dequantize().to(DEV))
            setattr(getattr(rlayer, rowner), name, dense)
    return m, ref


@here
def test_fused_int4_layer_equals_the_dequantized_modules_and_compiles_to_the_ops():
    fused_int4_layer_check()


def fused_int4_layer_check(hidden=64, inter=96):
    """A one-token step of a tiny int4 Llama through the fused layer equals its twin with the dequantized
    weights as bf16 modules, and compiles to the fused ops (also `test_triton_gemv_w4m`'s, on its layout)."""
    from augury.layers.attention import SeqSpec, build_attention_metadata

    m, ref = _tiny_int4_llama(hidden, inter)
    d = hidden // 4
    pools = {"k": [torch.zeros(32, 2, d, device=DEV, dtype=torch.bfloat16) for _ in range(2)],
             "v": [torch.zeros(32, 2, d, device=DEV, dtype=torch.bfloat16) for _ in range(2)]}

    class View:
        k, v, group_of_layer = pools["k"], pools["v"], ["full"] * 2

    pre = build_attention_metadata([SeqSpec(0, 6, {"full": [1, 2]})], 8, {"full": None}, DEV)
    step = build_attention_metadata([SeqSpec(6, 1, {"full": [1, 2]})], 8, {"full": None}, DEV)
    prompt, tok = torch.tensor([5, 17, 3, 40, 22, 9], device=DEV), torch.tensor([31], device=DEV)
    h = torch.zeros(1, hidden, device=DEV, dtype=torch.bfloat16)
    seen = []

    def backend(gm, example_inputs):
        seen.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm.forward

    def run(model, force, compiled=False):
        for p in pools["k"] + pools["v"]:
            p.zero_()
        fused_decode.FORCE = force
        try:
            with torch.no_grad():
                ref(prompt, pre.positions, pre, View)  # the same prefill K/V for both (never fused: 6 rows)
                if compiled:
                    torch._dynamo.reset()
                    return torch.compile(model, fullgraph=True, backend=backend)(tok, step.positions, step, View)
                return model(tok, step.positions, step, View)
        finally:
            fused_decode.FORCE = None
            torch._dynamo.reset()

    fused_decode.FORCE = True
    try:
        assert fused_decode.eligible(m.layers[0], h)
    finally:
        fused_decode.FORCE = None
    want = run(ref, False)
    got = run(m, True)
    torch.testing.assert_close(got.float(), want.float(), atol=2 ** -5 * want.abs().max().item(), rtol=0)
    compiled = run(m, True, compiled=True)
    assert sum("augury.gemv" in s for s in seen) == 6 and sum("augury.qkv_rope_kv" in s for s in seen) == 2
    assert torch.equal(compiled, got)
    return m


@here
def test_padded_or_biased_int4_layers_are_not_fused():
    lin = Int4Linear.from_linear(nn.Linear(64, 48, bias=True), 32)  # a bias
    assert _tinygemm_layout(lin).gemv_weight() is None
    lin = Int4Linear.from_linear(nn.Linear(64, 40, bias=False), 32)  # N padded to 48
    assert _tinygemm_layout(lin).gemv_weight() is None
    lin = Int4Linear.from_linear(nn.Linear(64, 48, bias=False), 32)
    assert lin.gemv_weight() is None  # CPU layout
    from augury.layers import quant_linear

    quant_linear._INT4_GEMV_ON = False  # (the fixture restores it)
    off = _tinygemm_layout(Int4Linear.from_linear(nn.Linear(64, 48, bias=False), 32))
    assert off.gemv_weight() is None and off.gemv_scales is None and off.gemv_packed is None  # off: no copies
    quant_linear._INT4_GEMV_ON = True
    got = _tinygemm_layout(lin).gemv_weight()  # tinygemm's bytes, the transposed scales (the default layout)
    assert got["w"] is lin.packed and got["scales_zeros"] is lin.gemv_scales and lin.gemv_packed is None
    assert torch.equal(lin.gemv_scales.T.contiguous().view(torch.bfloat16), lin.scales_zeros.view(-1, 48 * 2))


@here
def test_bad_int4_weights_and_configs_are_refused():
    packed, sz, _ = _int4(16, 64, 32, 2, seed=8)
    x = _rand(1, 64)
    with pytest.raises(ValueError, match="int4 scales"):  # the wrong group size for these scales
        gemv(x, packed, scales_zeros=sz, group_size=64)
    with pytest.raises(ValueError, match="transpose_scales"):  # neither layout
        gemv(x, packed, scales_zeros=sz.view(torch.bfloat16), group_size=32)
    with pytest.raises(ValueError, match="contiguous"):
        gemv(x, packed, scales_zeros=_untransposed(sz).transpose(0, 1).contiguous().transpose(0, 1), group_size=32)
    with pytest.raises(ValueError, match="tinygemm"):
        gemv(x, packed.view(16, 2, -1), scales_zeros=sz, group_size=32)
    with pytest.raises(ValueError, match="W4SplitConfig"):
        gemv(x, packed, scales_zeros=sz, group_size=32, cfg=GemvConfig())
    with pytest.raises(ValueError, match="GemvConfig"):
        gemv(x, torch.zeros(16, 64, device=DEV), cfg=W4())
    with pytest.raises(ValueError, match="powers of two"):
        gemv(x, packed, scales_zeros=sz, group_size=32, cfg=W4(block_n=24))
    with pytest.raises(ValueError, match=">= 8"):  # row tiles are whole 8-row blocks
        gemv(x, packed, scales_zeros=sz, group_size=32, cfg=W4(block_n=4, rows_per_program=16))
    with pytest.raises(ValueError, match="powers of two"):
        gemv(x, packed, scales_zeros=sz, group_size=32, cfg=W4(bko=0))
    with pytest.raises(ValueError, match="stages"):
        gemv(x, packed, scales_zeros=sz, group_size=32, cfg=W4(stages=0))
    p96, sz96, _ = _int4(16, 96, 32, 2, seed=8)
    with pytest.raises(ValueError, match="dividing K=96"):  # group 64 does not divide K
        gemv(_rand(1, 96), p96, scales_zeros=sz96[:, :1].contiguous(), group_size=64)
    with pytest.raises(ValueError, match="needs its scales"):
        gemv(x, packed)
    with pytest.raises(ValueError, match="rows_per_program"):
        gemv(x, packed, scales_zeros=sz, group_size=32, cfg=W4(block_n=64, rows_per_program=32))


@here
def test_qkv_rope_kv_on_int4_takes_whole_heads_of_24_rows():
    """head_dim 24: chunks of whole heads (no power of two), row tiles of 8 (the largest power of
    two dividing the head), whatever the config's block_n."""
    H, Hkv, D, hidden = 2, 1, 24, 64
    packed, sz, _ = _int4((H + 2 * Hkv) * D, hidden, 32, 2, seed=13)
    cos, sin = torch.ones(D, device=DEV), torch.zeros(D, device=DEV)
    k_pool, v_pool = torch.zeros(4, Hkv, D, device=DEV), torch.zeros(4, Hkv, D, device=DEV)
    x, g = _rand(1, hidden, seed=14), _rand(hidden, seed=15)
    q = qkv_rope_kv(x, packed, scales_zeros=sz, group_size=32, norm_weight=g, eps=1e-5, cos=cos, sin=sin,
                    k_pool=k_pool, v_pool=v_pool, slot=torch.tensor([1], device=DEV), num_heads=H, num_kv_heads=Hkv)
    qkv = gemv(x, packed, scales_zeros=sz, group_size=32, norm_weight=g, eps=1e-5)
    torch.testing.assert_close(q, qkv[:, : H * D], atol=1e-5, rtol=1e-5)  # cos 1, sin 0: rope is the identity
    torch.testing.assert_close(v_pool[1].flatten(), qkv[0, (H + Hkv) * D:], atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------------------- CUDA only


@cuda_only
@pytest.mark.parametrize("n,k", [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336), (128256, 4096)])
def test_llama3_8b_shapes_match_tinygemm(n, k):
    lin = nn.Linear(k, n, bias=False, device=DEV, dtype=torch.bfloat16)
    with torch.no_grad():
        lin.weight.normal_(0, 0.02)
    m = Int4Linear.from_linear(lin, 32)
    x = _rand(2, k, seed=9, dtype=torch.bfloat16)
    both = m(x)  # two rows: tinygemm
    one = m(x[:1])  # one row: the GEMV
    torch.testing.assert_close(one.float(), both[:1].float(), atol=2 ** -6 * both.abs().max().item(), rtol=0)
    for cfg in (W4(32, 2, 512, 2, stages=3), W4(32, 2, 512, 2, half2=False)):  # pipelined; the fp32 decode
        y = gemv(x[:1], m.packed, scales_zeros=m.scales_zeros, group_size=32, cfg=cfg)
        torch.testing.assert_close(y.float(), both[:1].float(), atol=2 ** -6 * both.abs().max().item(), rtol=0)


@cuda_only
def test_replays_in_a_cuda_graph():
    packed, sz, _ = _int4(6144, 4096, 32, 8, seed=10)  # 16 K slices per chunk: the counters reset each replay
    replays_in_a_cuda_graph(packed, sz)


def replays_in_a_cuda_graph(packed, sz, cfg=None):
    """A captured normed product of this [6144, 4096] int4 weight, replayed on new inputs, equals the
    eager call bit for bit (cfg: the launch's, else the shape's default)."""
    x, nw = _rand(1, 4096, seed=11, dtype=torch.bfloat16), _rand(4096, seed=12, dtype=torch.bfloat16)
    gemv(x, packed, scales_zeros=sz, group_size=32, norm_weight=nw, cfg=cfg)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = gemv(x, packed, scales_zeros=sz, group_size=32, norm_weight=nw, cfg=cfg)
    for _ in range(2):
        x.copy_(torch.randn_like(x))
        graph.replay()
        torch.testing.assert_close(out, gemv(x, packed, scales_zeros=sz, group_size=32, norm_weight=nw, cfg=cfg), atol=0, rtol=0)


@pytest.mark.skipif(FRESH, reason="this process runs the checks itself")
def test_in_fresh_process():
    rerun_in_fresh_process(__file__, timeout=900)
