"""The Triton int4 dequant-matmul equals dequantize + matmul (tinygemm's convention).

Runs under TRITON_INTERPRET=1 on the CPU (small shapes: the interpreter is slow); on a
CUDA machine the same checks run compiled, plus a comparison with tinygemm itself."""

from __future__ import annotations


import pytest
import torch

from tests.triton_env import interpreter, rerun_in_fresh_process  # noqa: E402

CPU, FRESH = interpreter()

from augury.layers.quant_linear import dequantize_int4, quantize_int4  # noqa: E402
from augury.layers.triton_int4 import LaunchConfig, int4_linear, pack, supported  # noqa: E402

here = pytest.mark.skipif(not FRESH, reason="triton was imported before the interpreter was on: test_in_fresh_process runs these")
cuda_only = pytest.mark.skipif(CPU, reason="needs a CUDA device")
DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")
SMALL = LaunchConfig(block_n=16, block_k=64, num_warps=4, num_stages=1)


def _weights(n, k, gs, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g)
    w[:, 3] *= 6  # an outlier column widens its group's range
    q, s, z = quantize_int4(w, gs, torch.float32)
    return q, s, z, dequantize_int4(q, s, z, gs)


def _check(m, n, k, gs, dtype=torch.float32, cfg=SMALL, tol=1e-4, seed=0, **kw):
    q, s, z, w = _weights(n, k, gs, seed)
    packed = pack(q, s, z, gs, dtype=torch.float32 if dtype == torch.float32 else torch.float16, device=DEV)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(seed + 1)).to(DEV, dtype)
    assert supported(x, packed)
    y = int4_linear(x, packed, cfg=cfg, **kw)
    ref = x.float().cpu() @ w.T
    assert y.shape == (m, n) and y.dtype == dtype
    torch.testing.assert_close(y.float().cpu(), ref, atol=tol * k ** 0.5, rtol=tol)
    return y


@here
@pytest.mark.parametrize("m", [1, 3, 16])
@pytest.mark.parametrize("gs", [32, 128])
def test_rows_and_groups(m, gs):
    _check(m, 48, 256, gs)


@here
def test_odd_k_and_n_partial_last_group():
    # K = 100: a partial last group (4 real columns) and padded words; N = 37: masked outputs
    _check(1, 37, 100, 32)
    _check(5, 37, 100, 32)


@here
@pytest.mark.parametrize("splits", [2, 3])
def test_split_k_sums_to_the_same_result(splits):
    one = _check(2, 32, 512, 64, splits=1)
    many = _check(2, 32, 512, 64, splits=splits)
    torch.testing.assert_close(one, many, atol=1e-4, rtol=1e-5)


@here
def test_one_row_on_both_paths_and_large_groups():
    # group 256 > the tile's 64 columns: groups span tiles
    a = _check(1, 32, 512, 256, use_dot=False)
    b = _check(1, 32, 512, 256, use_dot=True)
    torch.testing.assert_close(a, b, atol=1e-3, rtol=1e-4)


@here
def test_half_activations_and_leading_dims():
    q, s, z, w = _weights(24, 128, 32, seed=3)
    packed = pack(q, s, z, 32, dtype=torch.float16, device=DEV)
    x = torch.randn(2, 3, 128, generator=torch.Generator().manual_seed(4)).to(DEV, torch.float16)
    y = int4_linear(x, packed, cfg=SMALL)
    assert y.shape == (2, 3, 24) and y.dtype == torch.float16
    ref = (x.float().cpu().reshape(6, 128) @ w.T).reshape(2, 3, 24)
    torch.testing.assert_close(y.float().cpu(), ref, atol=3e-2, rtol=3e-3)


def test_pack_layout_and_checks():
    q = torch.randint(0, 16, (3, 40), dtype=torch.uint8)
    s = torch.ones(3, 2)
    p = pack(q, s, s, 32, dtype=torch.float32)
    assert p.qweight.shape == (8, 3) and p.qweight.dtype == torch.int32  # 64 padded columns / 8
    w = p.qweight.T.contiguous().view(torch.uint8).view(3, 32)  # little-endian bytes: low nibble first
    nib = torch.stack((w & 15, w >> 4), -1).view(3, 64)
    assert torch.equal(nib[:, :40], q) and not nib[:, 40:].any()
    with pytest.raises(ValueError):
        pack(q, s[:, :1], s[:, :1], 32)
    with pytest.raises(ValueError):
        pack(q, s, s, 48)
    assert not supported(torch.zeros(17, 40, device=DEV), p)  # a prefill: not this kernel's
    assert not supported(torch.zeros(1, 41, device=DEV), p)


@cuda_only
@pytest.mark.parametrize("m", [1, 4, 16])
def test_matches_tinygemm_on_8b_like_shapes(m):
    from augury.layers.quant_linear import Int4Linear, Int4Parts

    q, s, z, _ = _weights(1024, 4096, 32, seed=9)
    s, z = s.bfloat16().float(), z.bfloat16().float()
    lin = Int4Linear.from_parts(Int4Parts(q, s, z, 32), device="cuda")
    packed = pack(q, s, z, 32, device="cuda")
    x = torch.randn(m, 4096, device="cuda", dtype=torch.bfloat16)
    ref = x.float() @ dequantize_int4(q, s, z, 32).cuda().T
    got = int4_linear(x, packed)
    tg = lin(x)
    err_ours = (got.float() - ref).abs().max().item()
    err_tg = (tg.float() - ref).abs().max().item()
    assert err_ours <= 2 * err_tg + 0.05, (err_ours, err_tg)
    # CUDA graph capture: fixed grid, no host sync
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = int4_linear(x, packed)
    x.copy_(torch.randn_like(x))
    graph.replay()
    torch.testing.assert_close(out, int4_linear(x, packed), atol=0, rtol=0)


@pytest.mark.skipif(FRESH, reason="this process runs the checks itself")
def test_in_fresh_process():
    rerun_in_fresh_process(__file__, timeout=900)
