"""The many-row Triton steps (`triton_rows`: silu(gate) * up, rope) equal torch's eager bf16 ops bitwise,
and `row_ops` routes only eager CUDA bf16 tensors to them.

Runs under TRITON_INTERPRET=1 on the CPU; on a CUDA machine the same checks run compiled, against torch's
own CUDA kernels (the interpreter's exp is numpy's, so there silu is checked against the same formula)."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tests.triton_env import interpreter, rerun_in_fresh_process  # noqa: E402

CPU, FRESH = interpreter()

from augury.layers import row_ops, triton_rows as tr  # noqa: E402
from augury.layers.mlp import GatedMLP  # noqa: E402
from augury.layers.norm import RMSNorm  # noqa: E402
from augury.layers.rope import apply_rope  # noqa: E402

here = pytest.mark.skipif(not FRESH, reason="triton was imported before the interpreter was on: test_in_fresh_process runs these")
cuda_only = pytest.mark.skipif(CPU, reason="needs a CUDA device")
DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")
BF = torch.bfloat16


def _rand(*shape, seed=0, scale=3.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale).to(BF).to(DEV)


def _silu_mul_reference(gu: torch.Tensor) -> torch.Tensor:
    """F.silu(gate) * up as torch computes it (float32 x / (1 + exp(-x)), rounded; then the product,
    rounded), with the exp the kernel uses here: torch's on CUDA, numpy's under the interpreter."""
    gate, up = gu.chunk(2, dim=-1)
    if DEV.type == "cuda":
        return F.silu(gate) * up
    g = gate.float().numpy()
    act = torch.from_numpy(g / (np.float32(1.0) + np.exp(-g))).to(BF)
    return act * up


def _torch_rope(x, cos, sin):
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * sin


@here
@pytest.mark.parametrize("T,inter", [(1, 64), (5, 1000), (3, 2 * tr.ROW_BLOCK + 8)])
def test_silu_mul_is_torchs_bitwise(T, inter):
    gu = _rand(T, 2 * inter, seed=T * inter)
    gu[0, :4] = torch.tensor([0.0, -0.0, 80.0, -80.0], dtype=BF)  # zeros, saturated exp both ways
    assert torch.equal(tr.silu_mul(gu), _silu_mul_reference(gu))


@here
def test_silu_mul_reads_a_strided_row_view():
    wide = _rand(4, 3 * 256, seed=3)
    gu = wide[:, :512]  # row stride 768
    assert torch.equal(tr.silu_mul(gu), _silu_mul_reference(gu.contiguous()))


@here
@pytest.mark.parametrize("T,n,D", [(1, 3, 64), (7, 12, 64), (4, 40, 128), (2, 5, 256), (3, 1, 8)])
def test_rope_is_apply_ropes_torch_ops_bitwise(T, n, D):
    qkv = _rand(T, n + 4, D, seed=n * D)
    x = qkv[:, :n]  # the q/k heads of a fused qkv: strided rows, as the attention layer passes them
    cos = _rand(T, 1, D, seed=1, scale=1.0)
    sin = _rand(T, 1, D, seed=2, scale=1.0)
    out = tr.rope(x, cos, sin)
    assert out.is_contiguous() and out.shape == (T, n, D)
    assert torch.equal(out, _torch_rope(x, cos, sin))


@here
@pytest.mark.parametrize("T,D", [(1, 64), (9, 576), (3, tr.ROW_BLOCK + 40)])
def test_mul_rows_is_torchs_broadcast_product_bitwise(T, D):
    h = _rand(T, D + 8, seed=T + D)[:, :D]  # strided rows
    w = _rand(D, seed=5, scale=1.0)
    assert torch.equal(tr.mul_rows(h, w), w * h)


@here
def test_bad_arguments_are_clear_errors():
    with pytest.raises(ValueError, match="silu_mul"):
        tr.silu_mul(_rand(2, 7))
    with pytest.raises(ValueError, match="silu_mul"):
        tr.silu_mul(_rand(2, 8).float())
    with pytest.raises(ValueError, match="mul_rows"):
        tr.mul_rows(_rand(2, 8), _rand(7))
    with pytest.raises(ValueError, match="power of two"):
        tr.rope(_rand(2, 3, 48), _rand(2, 1, 48), _rand(2, 1, 48))


@pytest.fixture(autouse=True)
def _reread_the_switch():
    yield
    row_ops.reset()  # monkeypatch restores AUGURY_TRITON_ROWS after the test; the cached steps follow it


def _rows_off(monkeypatch, fn):
    """fn() with every step off, then the switch as it was."""
    before = os.environ.get("AUGURY_TRITON_ROWS")
    monkeypatch.setenv("AUGURY_TRITON_ROWS", "0")
    row_ops.reset()
    try:
        return fn()
    finally:
        if before is None:
            monkeypatch.delenv("AUGURY_TRITON_ROWS")
        else:
            monkeypatch.setenv("AUGURY_TRITON_ROWS", before)
        row_ops.reset()


def test_row_ops_leave_cpu_and_other_dtypes_to_torch():
    # even with TRITON_INTERPRET=1 set by this module, a CPU forward keeps torch's ops
    x = torch.randn(3, 2, 64).to(BF)
    assert row_ops.silu_mul(torch.randn(3, 64).to(BF)) is None
    assert row_ops.rope(x, x[:, :1], x[:, :1]) is None
    assert row_ops.mul_rows(x[:, 0], x[0, 0]) is None and not row_ops.norm_in_dtype(x)


def test_the_switch_takes_0_1_or_a_list_of_steps(monkeypatch):
    try:
        monkeypatch.setenv("AUGURY_TRITON_ROWS", "silu_mul, rope")
        row_ops.reset()
        assert row_ops._kernels("rope") is tr and row_ops._kernels("mul_rows") is None
        monkeypatch.setenv("AUGURY_TRITON_ROWS", "0")
        row_ops.reset()
        assert all(row_ops._kernels(s) is None for s in row_ops.STEPS)
        monkeypatch.setenv("AUGURY_TRITON_ROWS", "silu")
        row_ops.reset()
        with pytest.raises(ValueError, match="comma list of silu_mul, rope, mul_rows, norm"):
            row_ops._kernels("rope")
        monkeypatch.setenv("AUGURY_TRITON_ROWS", "1")
        row_ops.reset()
        assert all(row_ops._kernels(s) is tr for s in row_ops.STEPS)
    finally:
        monkeypatch.delenv("AUGURY_TRITON_ROWS")
        row_ops.reset()
    # unset: every step but the weight product (host-bound eager prefills ran slower with it)
    assert row_ops._kernels("mul_rows") is None
    assert all(row_ops._kernels(s) is tr for s in ("silu_mul", "rope", "norm"))


@cuda_only
@here
def test_row_ops_take_the_kernels_on_cuda_bf16_only_and_can_be_switched_off(monkeypatch):
    gu = _rand(6, 512, seed=9)
    assert torch.equal(row_ops.silu_mul(gu), _silu_mul_reference(gu))
    assert row_ops.silu_mul(gu.half()) is None
    assert _rows_off(monkeypatch, lambda: row_ops.silu_mul(gu)) is None


@cuda_only
@here
def test_mlp_and_apply_rope_equal_torchs_path_on_a_prefill_shape(monkeypatch):
    mlp = GatedMLP(256, 704, "silu", device=DEV, dtype=BF)
    x = _rand(300, 256, seed=4, scale=1.0)
    cos, sin = _rand(300, 1, 128, seed=5, scale=1.0), _rand(300, 1, 128, seed=6, scale=1.0)
    qk = _rand(300, 40, 128, seed=7)[:, :36]
    with torch.inference_mode():
        fast = mlp(x), apply_rope(qk, cos, sin)
        slow = _rows_off(monkeypatch, lambda: (mlp(x), apply_rope(qk, cos, sin)))
    assert torch.equal(fast[0], slow[0]) and torch.equal(fast[1], slow[1])


@cuda_only
@here
@pytest.mark.parametrize("shape,wshape,scale", [((1024, 4096), (4096,), 1.0), ((7, 576), (576,), 30.0),
                                                ((300, 640), (640,), 1e-3), ((5, 12, 128), (128,), 3.0),
                                                ((5, 12, 128), (12, 128), 3.0)])
@pytest.mark.parametrize("steps", ["", "1"])  # the default (no weight-product kernel) and all steps
def test_rms_norm_on_the_bf16_rows_is_the_float32_copys_bitwise(monkeypatch, shape, wshape, scale, steps):
    # RMSNorm reads bf16 rows straight (and scales them in one launch) on the GPU: torch's own steps' bits
    monkeypatch.setenv("AUGURY_TRITON_ROWS", steps)
    row_ops.reset()
    norm = RMSNorm(wshape, 1e-5, device=DEV, dtype=BF)
    with torch.no_grad():
        norm.weight.copy_(_rand(*wshape, seed=3, scale=1.0))
    x = _rand(*shape[:-1], shape[-1] + 64, seed=len(shape), scale=scale)[..., : shape[-1]]  # strided rows too
    for inp in (x, x.contiguous()):
        assert row_ops.norm_in_dtype(inp)
        fast = norm(inp)
        assert torch.equal(fast, _rows_off(monkeypatch, lambda: norm(inp)))
        assert torch.equal(fast, norm.weight * F.rms_norm(inp.float(), shape[-1:], None, 1e-5).to(BF))


@pytest.mark.skipif(FRESH, reason="this process runs the checks itself")
def test_in_fresh_process():
    rerun_in_fresh_process(__file__, timeout=900)
