"""The one-row int4 GEMV on its own row-major / tile-major layout (`triton_gemv_w4r`) equals the
dequantized product, with every prologue and epilogue, split over K or not, pipelined or not, and
`Int4Linear` builds that layout from tinygemm's bytes.

Runs under TRITON_INTERPRET=1 on the CPU (small shapes); on a CUDA machine the same checks run
compiled, plus the 8B shapes against tinygemm and a captured CUDA graph."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tests.triton_env import interpreter, rerun_in_fresh_process  # noqa: E402

CPU, FRESH = interpreter()

from augury.layers import int4_layout, triton_gemv_w4r  # noqa: E402
from augury.layers.quant_linear import Int4Linear, dequantize_int4, quantize_int4  # noqa: E402
from augury.layers.triton_gemv import gemv  # noqa: E402
from augury.layers.triton_gemv_w4r import W4RowsConfig as R  # noqa: E402
# the tinygemm-layout kernel's tests: their device, inputs and markers
from tests.layers.test_triton_gemv_int4 import DEV, _rand, cuda_only, here  # noqa: E402


def _int4(n, k, gs, seed):
    """-> (packed, scales, w): a random weight as `triton_gemv_w4r.pack` lays it out (tile-major where
    `blocked_entries` says so) and the fp32 weight it stands for (scale/zero rounded to bf16)."""
    w = _rand(n, k, seed=seed, scale=0.1).float().cpu()
    q, s, z = quantize_int4(w, gs)
    sz = torch.stack([s.T, z.T], -1).to(torch.bfloat16).contiguous()
    packed, scales = triton_gemv_w4r.pack(q, int4_layout.transpose_scales(sz), gs)
    return packed.to(DEV), scales.to(DEV), dequantize_int4(q, s, z, gs).to(DEV)


def _close(y, ref):
    y, ref = y.float(), ref.float()
    torch.testing.assert_close(y, ref, atol=2 ** -6 * ref.abs().max().item(), rtol=0)


# (group, N, K, config): several K slices, a ragged last slice, a slice wider than K (one slice:
# the output straight from the row tiles), ragged chunks, groups wider than an entry, row tiles
# pipelined through shared memory, tile-major weights (K of whole slices, 16-row blocks: K=1024,
# 2048), the shape-based default
CASES = [(32, 16, 128, R(8, 2, 16, 4)), (32, 24, 96, R(8, 2, 16, 4)), (32, 16, 64, R(8, 4, 16, 4)),
         (128, 16, 256, R(8, 2, 16, 4)), (64, 40, 256, R(8, 4, 16, 2, stages=3)), (256, 8, 512, R(8, 8, 8, 4)),
         (32, 40, 512, R(8, 16, 16, 4)), (32, 48, 1024, R(16, 8, 32, 4)), (32, 64, 1024, R(32, 8, 64, 4, stages=3)),
         (32, 32, 2048, None), (32, 72, 512, None), (32, 16, 256, R(8, 2, 16, 4, late_launch=True))]


@here
@pytest.mark.parametrize("gs,n,k,cfg", CASES)
def test_product_with_each_prologue_equals_the_dequantized_weight(gs, n, k, cfg):
    dtype = torch.bfloat16
    packed, sz, w = _int4(n, k, gs, seed=n + k)
    x = _rand(1, k, seed=1, dtype=dtype, scale=2.0)
    _close(gemv(x, packed, scales_zeros=sz, group_size=gs, cfg=cfg), F.linear(x.float(), w))
    # norm prologue + residual epilogue
    g, r = _rand(k, seed=2, dtype=dtype), _rand(1, n, seed=3, dtype=dtype)
    xn = (g * F.rms_norm(x.float(), (k,), None, 1e-5).to(dtype)).to(dtype)
    ref = F.linear(xn.float(), w).to(dtype).float() + r.float()
    _close(gemv(x, packed, scales_zeros=sz, group_size=gs, norm_weight=g, eps=1e-5, residual=r, cfg=cfg), ref)
    # silu_mul prologue
    gu = _rand(1, 2 * k, seed=4, dtype=dtype)
    act = (F.silu(gu[:, :k]) * gu[:, k:]).to(dtype)
    _close(gemv(gu, packed, scales_zeros=sz, group_size=gs, silu_mul=True, cfg=cfg), F.linear(act.float(), w))


@here
def test_every_nibble_value_meets_its_own_column():
    """q = 0..15 at every nibble position, each column's q unlike its neighbours': one input at a
    time (a power of two, so every product is exact), each output column must be that input times
    its own weight; a nibble read as another column's shows."""
    n, k, gs = 16, 64, 32
    r, c = torch.arange(n)[:, None], torch.arange(k)[None, :]
    q = ((r + c + 5 * (c // 8)) % 16).to(torch.uint8)
    s = torch.full((n, 2), 0.5).to(torch.bfloat16).float()
    z = torch.full((n, 2), 0.25).to(torch.bfloat16).float()
    packed, sz = triton_gemv_w4r.pack(q, int4_layout.transpose_scales(
        torch.stack([s.T, z.T], -1).to(torch.bfloat16).contiguous()), gs)
    w = dequantize_int4(q, s, z, gs).to(DEV)
    for col in range(k):
        x = torch.zeros(1, k, device=DEV, dtype=torch.bfloat16)
        x[0, col] = 2.0 ** (col % 5 - 2)
        y = gemv(x, packed.to(DEV), scales_zeros=sz.to(DEV), group_size=gs, cfg=R(8, 1, 16, 4))  # 2 slices
        assert torch.equal(y, F.linear(x.double(), w.double()).to(torch.bfloat16)), col


@here
def test_tile_major_weights_read_as_the_row_major_ones():
    """A shape `blocked_entries` blocks gives the same values from its tile-major bytes as the row-major
    bytes give at a config of the same slices (the tile order is only where the bytes lie)."""
    n, k, gs = 48, 1024, 32
    e = triton_gemv_w4r.blocked_entries(n, k, gs)
    assert e == triton_gemv_w4r.default_config(n, k).entries
    packed, sz, w = _int4(n, k, gs, seed=5)
    rows, srows = int4_layout.unblock_rows(packed.cpu(), sz.cpu(), e)
    q = int4_layout.unpack_rows(rows)
    assert torch.equal(int4_layout.block_rows(rows, srows, e)[0], packed.cpu())
    x = _rand(1, k, seed=6, dtype=torch.bfloat16)
    y = gemv(x, packed, scales_zeros=sz, group_size=gs)
    _close(y, F.linear(x.float(), w))
    assert q.shape == (n, k) and int(q.max()) <= 15


@here
@pytest.mark.parametrize("n_heads,hidden,cfg", [(4, 64, R(8, 1, 32, 4)), (4, 1024, None), (2, 1024, R(16, 8, 64, 4))])
def test_qkv_rope_kv_equals_its_product_rope_and_pool_write(n_heads, hidden, cfg):
    """Several K slices (the chunk's last program applies rope), tile-major weights, and one slice over
    K (the program applies it to its own rows)."""
    from tests.layers.test_triton_gemv_int4 import qkv_rope_kv_against_its_parts

    H, Hkv, D = n_heads, 2, 16
    packed, sz, _ = _int4((H + 2 * Hkv) * D, hidden, 32, seed=7)
    q, qk, _, _ = qkv_rope_kv_against_its_parts(packed, sz, 32, H, Hkv, D, hidden, torch.bfloat16, cfg, seed=8)
    assert torch.equal(q.view(1, H, D), qk[:, :H])  # the same sums, whichever program adds them: bitwise


@here
def test_int4_linear_builds_the_gemv_layout_from_tinygemm_bytes(monkeypatch):
    for n, k in ((48, 64), (32, 1024)):  # row-major; tile-major
        lin = int4_linear_from_tinygemm_bytes(n, k, "rows", monkeypatch)
        got = lin.gemv_weight()
        assert got["w"] is lin.gemv_packed and got["scales_zeros"] is lin.gemv_scales
        e = triton_gemv_w4r.blocked_entries(n, k, 32)
        rows, srows = (int4_layout.unblock_rows(lin.gemv_packed, lin.gemv_scales, e) if e
                       else (lin.gemv_packed, lin.gemv_scales))
        assert (e is not None) == (k == 1024)
        assert torch.equal(int4_layout.unpack_rows(rows).cpu(), lin.unpack())
        assert torch.equal(srows, int4_layout.transpose_scales(lin.scales_zeros))
        x = _rand(1, k, seed=10, dtype=torch.bfloat16)
        _close(gemv(x, **got), F.linear(x.float(), lin.dequantize().to(DEV).float()))


def int4_linear_from_tinygemm_bytes(n, k, layout, monkeypatch) -> Int4Linear:
    """A random [n, k] Int4Linear held in tinygemm's CUDA bytes (on CUDA: packed by its first forward),
    its GEMV copy built under AUGURY_INT4_GEMV_LAYOUT=layout (also `test_triton_gemv_w4m`'s)."""
    from augury.layers import quant_linear
    from tests.layers.test_triton_gemv_int4 import _tinygemm_layout

    monkeypatch.setattr(quant_linear, "_INT4_GEMV_ON", True)
    monkeypatch.setattr(quant_linear, "_INT4_GEMV_LAYOUT", layout)
    lin = Int4Linear.from_linear(nn.Linear(k, n, bias=False), 32)
    if not CPU:
        lin = lin.to(DEV)
        lin(torch.zeros(1, k, device=DEV, dtype=torch.bfloat16))
    return _tinygemm_layout(lin)


@here
def test_bad_configs_and_scales_are_refused():
    packed, sz, _ = _int4(32, 1024, 32, seed=11)  # tile-major at 8 entries per slice
    x = _rand(1, 1024, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="blocked for 8 entries"):
        gemv(x, packed, scales_zeros=sz, group_size=32, cfg=R(16, 4, 32, 4))
    with pytest.raises(ValueError, match="blocked for 8 entries"):  # row tiles of whole 16-row blocks
        gemv(x, packed, scales_zeros=sz, group_size=32, cfg=R(8, 8, 32, 4))
    with pytest.raises(ValueError, match="W4RowsConfig"):
        from augury.layers.triton_gemv_w4 import W4SplitConfig

        gemv(x, packed, scales_zeros=sz, group_size=32, cfg=W4SplitConfig())
    with pytest.raises(ValueError, match="int32 scales"):
        gemv(x, packed, scales_zeros=sz.view(torch.bfloat16), group_size=32)
    p2, s2, _ = _int4(16, 128, 32, seed=12)
    with pytest.raises(ValueError, match="powers of two"):
        gemv(_rand(1, 128, dtype=torch.bfloat16), p2, scales_zeros=s2, group_size=32, cfg=R(8, 3, 16, 4))
    with pytest.raises(ValueError, match="rows_per_program"):
        gemv(_rand(1, 128, dtype=torch.bfloat16), p2, scales_zeros=s2, group_size=32, cfg=R(16, 2, 8, 4))


def test_layout_round_trips_and_refusals():
    q = torch.randint(0, 16, (32, 512), generator=torch.Generator().manual_seed(0), dtype=torch.uint8)
    rows = int4_layout.pack_rows(q)
    assert rows.shape == (32, 64) and torch.equal(int4_layout.unpack_rows(rows), q)
    # the nibble pairs one LOP3 decodes are adjacent columns: (0, 1) in bits 0-3 / 16-19, (2, 3) in 4-7 / 20-23
    w = int(rows[3, 5]) & 0xFFFFFFFF
    assert [(w >> 4 * b) & 15 for b in (0, 4, 1, 5, 2, 6, 3, 7)] == q[3, 40:48].tolist()
    sc = torch.randint(-2**31, 2**31 - 1, (32, 16), dtype=torch.int32)
    bw, bs = int4_layout.block_rows(rows, sc, 4)
    assert torch.equal(bw.view(-1)[:16 * 16], rows[:16, :16].reshape(-1))  # the first tile: 16 rows x 16 words
    assert torch.equal(bs.view(-1)[:16 * 4], sc[:16, :4].reshape(-1))
    assert all(torch.equal(a, b) for a, b in zip(int4_layout.unblock_rows(bw, bs, 4), (rows, sc)))
    with pytest.raises(ValueError, match="K % 8"):
        int4_layout.pack_rows(q[:, :12])
    with pytest.raises(ValueError, match="16 x"):
        int4_layout.block_rows(rows[:24], sc[:24], 4)


# ---------------------------------------------------------------------------- CUDA only


LLAMA3_8B_SHAPES = [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336), (128256, 4096)]


@cuda_only
@pytest.mark.parametrize("n,k", LLAMA3_8B_SHAPES)
def test_llama3_8b_shapes_match_tinygemm(n, k, monkeypatch):
    m = matches_tinygemm(n, k, "rows", monkeypatch)
    assert m.gemv_packed.dim() == 2 and triton_gemv_w4r.blocked_entries(n, k, 32) is not None


def matches_tinygemm(n, k, layout, monkeypatch) -> Int4Linear:
    """An [n, k] Int4Linear with AUGURY_INT4_GEMV_LAYOUT=layout: its one-row product (the GEMV on its own
    copy) equals tinygemm's for the same row of a two-row input. -> the module."""
    from augury.layers import quant_linear

    monkeypatch.setattr(quant_linear, "_INT4_GEMV_ON", True)
    monkeypatch.setattr(quant_linear, "_INT4_GEMV_LAYOUT", layout)
    lin = nn.Linear(k, n, bias=False, device=DEV, dtype=torch.bfloat16)
    with torch.no_grad():
        lin.weight.normal_(0, 0.02)
    m = Int4Linear.from_linear(lin, 32)
    assert m.gemv_packed is not None
    x = _rand(2, k, seed=9, dtype=torch.bfloat16)
    both = m(x)  # two rows: tinygemm
    one = m(x[:1])  # one row: the GEMV on its own layout
    torch.testing.assert_close(one.float(), both[:1].float(), atol=2 ** -6 * both.abs().max().item(), rtol=0)
    return m


@cuda_only
def test_late_launch_under_pdl_is_bitwise_the_plain_launch():
    late_launch_check(lambda n, k, seed: _int4(n, k, 32, seed),
                      replace(triton_gemv_w4r.default_config(28672, 4096), late_launch=True))


def late_launch_check(int4, late):
    """down's shape under PDL after a gate_up product of config `late` (one that lets it launch only after
    its tiles), with a new input each time: bitwise the launch without PDL on the finished input. int4:
    (n, k, seed) -> (packed, scales, w) in the layout under test (also `test_triton_gemv_w4m`'s)."""
    from augury.layers.triton_pdl import pdl_enabled

    if not pdl_enabled(DEV):
        pytest.skip("no programmatic dependent launch on this device")
    p0, s0, _ = int4(28672, 4096, 40)
    p1, s1, _ = int4(4096, 14336, 41)
    r = _rand(1, 4096, seed=42, dtype=torch.bfloat16)
    for i in range(3):
        gu = gemv(_rand(1, 4096, seed=43 + i, dtype=torch.bfloat16), p0, scales_zeros=s0, group_size=32, cfg=late,
                  pdl=True)
        got = gemv(gu, p1, scales_zeros=s1, group_size=32, silu_mul=True, residual=r, pdl=True)
        torch.cuda.synchronize()
        assert torch.equal(got, gemv(gu.clone(), p1, scales_zeros=s1, group_size=32, silu_mul=True, residual=r,
                                     pdl=False))


@cuda_only
def test_replays_in_a_cuda_graph():
    from tests.layers.test_triton_gemv_int4 import replays_in_a_cuda_graph

    packed, sz, _ = _int4(6144, 4096, 32, seed=10)  # several K slices per chunk: the counters reset each replay
    replays_in_a_cuda_graph(packed, sz)


@pytest.mark.skipif(FRESH, reason="this process runs the checks itself")
def test_in_fresh_process():
    rerun_in_fresh_process(__file__, timeout=900)
