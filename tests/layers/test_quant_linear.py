"""Int8Linear / Int4Linear: quantization error bounds, forward == x @ dequantize().T + b,
exact int4 round trips through the kernels' packed layouts, CUDA paths."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from augury.layers.quant_linear import (
    INT8_DENSE_MIN_ROWS,
    Int4Linear,
    Int4Parts,
    Int8Linear,
    dequantize_int4,
    quantize_int4,
    quantize_int8,
)

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

# SmolLM2 projections (qkv, gate_up, down) and awkward ones: K not a multiple of 16 / of the
# group, N not a multiple of 16
SHAPES = [(576, 960), (576, 3072), (1536, 576), (100, 50), (13, 7), (160, 24)]
BF16_TOL = 1e-2  # bf16 output rounding, relative to the largest output; a real bug is O(1)
# augury's CPU int4 kernel quantizes activations to int8 per 32 columns (its own tests,
# tests/cpu_kernels/test_int4.py, check that arithmetic exactly); half a step of 1/127 per term
INT8_ACT_TOL = 2.5e-2


def _linear(k: int, n: int, bias: bool = True, seed: int = 0) -> nn.Linear:
    torch.manual_seed(seed)
    lin = nn.Linear(k, n, bias=bias)
    with torch.no_grad():
        lin.weight.normal_(0, 0.05)
        if bias:
            lin.bias.normal_(0, 0.1)
    return lin


def _reference(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, act_dtype: torch.dtype) -> torch.Tensor:
    """What the module should compute: activations rounded to act_dtype, then exact math."""
    y = x.to(act_dtype).double() @ w.double().T
    return y if bias is None else y + bias.double()


def _assert_matches(y: torch.Tensor, ref: torch.Tensor, rel: float) -> None:
    err = (y.double() - ref).abs().max().item()
    scale = ref.abs().max().item()
    assert err <= rel * scale, f"max err {err:.3g} vs tolerance {rel * scale:.3g}"


# ---------------------------------------------------------------------------- quantization math


def test_int8_error_bound():
    w = torch.randn(64, 200) * torch.rand(64, 1)  # rows of different ranges
    q, scale = quantize_int8(w)
    assert q.dtype == torch.int8 and q.abs().max() <= 127
    assert torch.equal(scale, scale.to(torch.bfloat16).float())  # kernel-representable
    err = (q.float() * scale[:, None] - w).abs()
    bound = 0.5 * scale + w.abs().amax(1) * 2**-8  # half a step + bf16 rounding of the scale
    assert (err <= bound[:, None] + 1e-7).all()


def test_int8_fp32_scales_are_not_rounded():
    w = torch.randn(16, 64)
    q, scale = quantize_int8(w, torch.float32)
    err = (q.float() * scale[:, None] - w).abs()
    assert (err <= 0.5 * scale[:, None] * (1 + 1e-6)).all()


@pytest.mark.parametrize("group_size", [32, 64, 128])
def test_int4_error_bound(group_size):
    k = 200  # a partial last group
    w = torch.randn(48, k) + 0.5 * torch.randn(48, 1)  # groups off zero too
    q, scale, zero = quantize_int4(w, group_size)
    assert q.dtype == torch.uint8 and q.max() <= 15
    assert scale.shape == zero.shape == (48, -(-k // group_size))
    deq = dequantize_int4(q, scale, zero, group_size)
    s = scale.repeat_interleave(group_size, 1)[:, :k]
    z = zero.repeat_interleave(group_size, 1)[:, :k]
    bound = 0.5 * s + (z.abs() + 8 * s) * 2**-8 + 1e-6  # half a step + bf16 rounding of scale/zero
    assert ((deq - w).abs() <= bound).all()
    # the partial group's range comes from real columns only: its extremes are (nearly) hit
    last = w[:, (k // group_size) * group_size :]
    assert (deq[:, -last.shape[1] :].amax(1) - last.amax(1)).abs().max() <= s.max()


def test_int4_constant_group_is_exact():
    w = torch.full((16, 32), 0.375)
    q, scale, zero = quantize_int4(w, 32)
    assert torch.equal(dequantize_int4(q, scale, zero, 32), w)


# ---------------------------------------------------------------------------- forward vs dequantize


@pytest.mark.parametrize("k,n", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 9, 40])  # 40: the dense (dequantize-slices) path
def test_int8_forward_matches_dequantized(k, n, dtype, rows):
    lin = _linear(k, n)
    m = Int8Linear.from_linear(lin)
    x = torch.randn(rows, k, dtype=dtype)
    y = m(x)
    assert y.dtype == dtype and y.shape == (rows, n)
    _assert_matches(y, _reference(x, m.dequantize(), lin.bias, torch.bfloat16), BF16_TOL)


@pytest.mark.parametrize("k,n", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 9])
@pytest.mark.parametrize("group_size", [32, 128])
def test_int4_forward_matches_dequantized(k, n, dtype, rows, group_size):
    lin = _linear(k, n)
    m = Int4Linear.from_linear(lin, group_size)
    x = torch.randn(rows, k, dtype=dtype)
    y = m(x)
    assert y.dtype == dtype and y.shape == (rows, n)
    _assert_matches(y, _reference(x, m.dequantize(), lin.bias, torch.bfloat16), INT8_ACT_TOL if m._native else BF16_TOL)


@pytest.mark.parametrize("n", [50, 4000])  # 4000 x 576: several dequantized slices
def test_int8_dense_path_matches_kernel(n):
    m = Int8Linear.from_linear(_linear(576, n))
    x = torch.randn(INT8_DENSE_MIN_ROWS + 3, 576, dtype=torch.bfloat16)
    dense = m(x)
    m.dense_min_rows = 10**9
    kernel = m(x)
    ref = _reference(x, m.dequantize(), m.bias, torch.bfloat16)
    _assert_matches(dense, ref, BF16_TOL)
    _assert_matches(kernel, ref, BF16_TOL)


@pytest.mark.parametrize("dense", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n", [50, 4000])
def test_int8_dense_path_multiplies_in_the_cpu_dense_dtype(monkeypatch, dense, n):
    """Without bf16 matmul instructions the dense slices multiply in float32 (torch's bf16 matmul is
    ~8x slower there); the output still has the module's activation dtype."""
    from augury.layers import quant_linear as ql

    seen = []
    real = ql.F.linear
    monkeypatch.setattr(ql, "cpu_dense_dtype", lambda: dense)
    monkeypatch.setattr(ql.F, "linear", lambda x, w, *a: seen.append((x.dtype, w.dtype)) or real(x, w, *a))
    m = Int8Linear.from_linear(_linear(576, n))
    x = torch.randn(INT8_DENSE_MIN_ROWS + 3, 576, dtype=torch.bfloat16)
    y = m(x)
    assert y.dtype == torch.bfloat16 and seen and set(seen) == {(dense, dense)}
    _assert_matches(y, _reference(x, m.dequantize(), m.bias, torch.bfloat16), BF16_TOL)


@pytest.mark.parametrize("cls", [Int8Linear, Int4Linear])
@pytest.mark.parametrize("k,n", [(576, 960), (100, 50)])
def test_fp32_kernels_are_exact(cls, k, n):
    """act_dtype=float32 (slow kernels) must agree with the float reference to fp32 accuracy."""
    lin = _linear(k, n)
    m = cls.from_linear(lin, act_dtype=torch.float32)
    x = torch.randn(3, k)
    _assert_matches(m(x), _reference(x, m.dequantize(), lin.bias, torch.float32), 1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("cls", [Int8Linear, Int4Linear])
def test_lm_head_shape(cls):
    lin = _linear(576, 49152, bias=False)
    m = cls.from_linear(lin)
    w = m.dequantize()
    assert (w - lin.weight).abs().max() < 0.05 * lin.weight.abs().max()
    for rows in (1, 4):
        x = torch.randn(rows, 576, dtype=torch.bfloat16)
        _assert_matches(m(x), _reference(x, w, None, torch.bfloat16), BF16_TOL)


@pytest.mark.parametrize("cls", [Int8Linear, Int4Linear])
def test_leading_dims_and_no_bias(cls):
    lin = _linear(64, 32, bias=False)
    m = cls.from_linear(lin)
    assert m.bias is None
    x = torch.randn(2, 3, 64)
    y = m(x)
    assert y.shape == (2, 3, 32)
    _assert_matches(y.reshape(6, 32), _reference(x.reshape(6, 64), m.dequantize(), None, torch.bfloat16), BF16_TOL)


@pytest.mark.parametrize("cls", [Int8Linear, Int4Linear])
def test_quantizing_leaves_source_alone(cls):
    lin = _linear(64, 32)
    before = lin.weight.detach().clone()
    cls.from_linear(lin)
    assert torch.equal(lin.weight, before)


def test_quantized_weights_track_the_float_weights():
    lin = _linear(576, 960)
    assert (Int8Linear.from_linear(lin).dequantize() - lin.weight).abs().max() < 0.01 * lin.weight.abs().max()
    assert (Int4Linear.from_linear(lin).dequantize() - lin.weight).abs().max() < 0.15 * lin.weight.abs().max()


# ---------------------------------------------------------------------------- int4 packing


@pytest.mark.parametrize("k,n", [(64, 16), (576, 960), (100, 50), (32, 1)])
def test_int4_pack_unpack_round_trip(k, n):
    g = torch.Generator().manual_seed(k * n)
    q = torch.randint(0, 16, (n, k), generator=g, dtype=torch.uint8)
    scale = torch.rand(n, -(-k // 32), generator=g) + 0.1
    zero = torch.randn(n, -(-k // 32), generator=g)
    m = Int4Linear.from_parts(Int4Parts(q, scale, zero, 32), act_dtype=torch.float32)
    assert torch.equal(m.unpack(), q)
    parts = m.parts()
    assert torch.equal(parts.scale, scale) and torch.equal(parts.zero, zero)


def test_int4_state_dict_round_trip():
    m = Int4Linear.from_linear(_linear(96, 48))
    fresh = Int4Linear(96, 48, 32, bias=True)
    fresh.load_state_dict(m.state_dict())
    x = torch.randn(2, 96, dtype=torch.bfloat16)
    assert torch.equal(fresh(x), m(x))


def test_int4_parts_cat_and_rows():
    a = Int4Linear.from_linear(_linear(64, 16, seed=1)).parts()
    b = Int4Linear.from_linear(_linear(64, 32, seed=2)).parts()
    fused = Int4Parts.cat([a, b])
    assert fused.q.shape == (48, 64)
    assert torch.equal(fused.dequantize()[16:], b.dequantize())
    perm = torch.arange(15, -1, -1)
    assert torch.equal(a.rows(perm).dequantize(), a.dequantize()[perm])


def test_bad_arguments():
    with pytest.raises(ValueError, match="group_size"):
        Int4Linear.from_linear(_linear(64, 16), group_size=48)
    with pytest.raises(ValueError, match="act_dtype"):
        Int8Linear.from_linear(_linear(64, 16), act_dtype=torch.int8)


# ---------------------------------------------------------------------------- CUDA


@needs_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("cls", [Int8Linear, Int4Linear])
@pytest.mark.parametrize("k,n", [(576, 960), (1536, 576), (576, 49152), (100, 50)])
@pytest.mark.parametrize("rows", [1, 9])
def test_cuda_forward_matches_dequantized(cls, k, n, rows):
    lin = _linear(k, n).cuda()
    m = cls.from_linear(lin)
    x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
    y = m(x)
    assert y.device.type == "cuda"
    w = m.dequantize().to("cuda")
    _assert_matches(y, _reference(x, w, lin.bias, torch.bfloat16), BF16_TOL)


@needs_cuda
@pytest.mark.gpu
def test_int4_moves_between_cpu_and_cuda():
    lin = _linear(576, 960)
    m = Int4Linear.from_linear(lin)
    w = m.dequantize()
    x = torch.randn(3, 576, dtype=torch.bfloat16)
    y_cpu = m(x)
    m.cuda()
    y_cuda = m(x.cuda())  # repacked into tinygemm's layout on first use
    assert torch.equal(m.dequantize(), w)
    _assert_matches(y_cuda.cpu(), y_cpu.double(), BF16_TOL)
    m.cpu()
    assert torch.equal(m(x), y_cpu)


@needs_cuda
@pytest.mark.gpu
def test_int4_cuda_needs_bf16():
    with pytest.raises(ValueError, match="bfloat16"):
        Int4Linear.from_linear(_linear(64, 16).cuda(), act_dtype=torch.float32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_int4_plain_fast_path_is_bit_identical(dtype):
    """An aligned, bias-free Int4Linear takes the one-kernel path; it must equal the general path."""
    torch.manual_seed(0)
    m = Int4Linear.from_linear(nn.Linear(128, 64, bias=False), 32)
    assert m._plain
    x = torch.randn(3, 128, dtype=dtype)
    fast = m(x)
    m._plain = False
    torch.testing.assert_close(fast, m(x), atol=0, rtol=0)
    assert fast.dtype == dtype
    assert not Int4Linear.from_linear(nn.Linear(128, 64, bias=True), 32)._plain
    assert not Int4Linear.from_linear(nn.Linear(100, 64, bias=False), 32)._plain  # K padded to whole groups


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("bias", [False, True])
def test_int4_dense_copy_for_many_rows(bias, dtype):
    """keep_dense_copy: many-row inputs go through the dense copy (bf16: the weight rounded to bf16;
    float32: exactly the kernel's weight), few rows through the kernel; both stay close to the
    dequantized reference."""
    torch.manual_seed(0)
    m = Int4Linear.from_linear(nn.Linear(128, 64, bias=bias), 32)
    few, many = torch.randn(2, 128), torch.randn(m.dense_min_rows, 128)
    before = m(few)
    m.keep_dense_copy(dtype)
    assert m.dense_weight.dtype == dtype and m.dense_weight.shape == (64, 128)
    if dtype == torch.float32:
        assert torch.equal(m.dense_weight, m.dequantize())
    torch.testing.assert_close(m(few), before, atol=0, rtol=0)  # the kernel still serves few rows
    ref = many.to(dtype).float() @ m.dequantize().to(dtype).float().T
    if bias:
        ref = ref + m.bias
    got = m(many)
    torch.testing.assert_close(got, ref, atol=2e-2, rtol=2e-2)
    # the many-row result is exactly the dense matmul on the copy
    want = torch.nn.functional.linear(many.to(dtype), m.dense_weight).float()
    torch.testing.assert_close(got, want if not bias else want + m.bias, atol=0, rtol=0)


def test_the_default_dense_copy_is_float32_without_bf16_hardware(monkeypatch):
    """bf16 copies only where the CPU multiplies bf16 in hardware (torch's bf16 fallback measured 8x
    slower than float32 on an AVX2-only host); decided from the instruction set."""
    from augury.layers import quant_linear as ql

    for bf16_hw, want in ((False, torch.float32), (True, torch.bfloat16)):
        ql.cpu_dense_dtype.cache_clear()
        monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda v=bf16_hw: v)
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
        assert ql.cpu_dense_dtype() == want
        m = Int4Linear.from_linear(nn.Linear(64, 32, bias=False), 32)
        m.keep_dense_copy()
        assert m.dense_weight.dtype == want
    ql.cpu_dense_dtype.cache_clear()


def test_dense_prefill_copies_only_where_they_beat_the_int4_kernel(tmp_path):
    """A CPU int4 model keeps dense copies for prefill only where the CPU has AMX or augury's int4
    kernel has no SIMD path (the AVX2 kernel measured 1.6-5.3x faster than MKL float32 on the copy,
    the VNNI one 1.2-2.1x faster than oneDNN bf16, 16-512 rows); the engine loader follows the rule."""
    from augury.engine.engine import Engine
    from augury.layers import quant_linear as ql
    from tests.conftest import make_tiny_hf_model

    assert ql.dense_copy_rule(True, "avx2") and ql.dense_copy_rule(True, "avx512vnni")
    assert not ql.dense_copy_rule(False, "avx2") and not ql.dense_copy_rule(False, "avx512vnni")
    assert ql.dense_copy_rule(False, "portable") and ql.dense_copy_rule(False, None)
    e = Engine.from_model(str(make_tiny_hf_model(tmp_path, "llama")), device="cpu", dtype="float32",
                          weights="int4", progress=False, kv_budget="16MiB")
    try:
        mods = [m for n, m in e.loaded.model.named_modules() if isinstance(m, Int4Linear) and "lm_head" not in n]
        assert mods and all((m.dense_weight is not None) == ql.dense_prefill_pays() for m in mods)
    finally:
        e.shutdown()


def test_keep_dense_copies_budget_and_lm_head():
    from augury.layers.quant_linear import keep_dense_copies

    model = nn.Sequential()
    model.add_module("proj", Int4Linear.from_linear(nn.Linear(64, 32), 32))
    model.add_module("lm_head", Int4Linear.from_linear(nn.Linear(64, 96), 32))
    assert keep_dense_copies(model, max_bytes=100) == 0 and model.proj.dense_weight is None
    assert keep_dense_copies(model, dtype=torch.bfloat16) == 32 * 64 * 2
    assert keep_dense_copies(model, dtype=torch.float32) == 32 * 64 * 4
    assert keep_dense_copies(model, max_bytes=32 * 64 * 3, dtype=torch.float32) == 0  # the budget counts 4 bytes
    assert model.proj.dense_weight is not None and model.lm_head.dense_weight is None


@pytest.mark.parametrize("cls", [Int8Linear, Int4Linear])
@pytest.mark.parametrize("k, n", [(576, 960), (576, 3072), (1536, 576), (100, 50)])
def test_kernel_rows_are_batch_invariant(cls, k, n):
    """Below the dense switch a row's output is bitwise the same alone and inside an M-row call
    (1 and 2 threads): a verify window (1 + drafts rows) or a batch then sees exactly the linear
    outputs a one-token decode step sees. The many-row dense path is a different rounding, so
    every M tested here stays below dense_min_rows (verify windows must too, see INT4_DENSE_MIN_ROWS)."""
    m = cls.from_linear(_linear(k, n, bias=False))
    m.keep_dense_copy() if cls is Int4Linear else None
    x = torch.randn(m.dense_min_rows - 1, k, generator=torch.Generator().manual_seed(1))
    threads = torch.get_num_threads()
    try:
        for t in (1, 2):
            torch.set_num_threads(t)
            alone = torch.cat([m(x[i:i + 1]) for i in range(x.shape[0])])
            for rows in range(2, x.shape[0] + 1):
                assert torch.equal(m(x[:rows]), alone[:rows]), f"{rows} rows, {t} threads"
    finally:
        torch.set_num_threads(threads)
