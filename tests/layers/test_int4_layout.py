"""`int4_layout` is tinygemm's packed layout: a round trip on any device, and bit for bit torch's
converter on CUDA (the Triton GEMV reads those bytes in place)."""

from __future__ import annotations

import pytest
import torch

from augury.layers import int4_layout

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.parametrize("t", int4_layout.INNER_K_TILES)
def test_pack_unpack_round_trip(t):
    q = torch.randint(0, 16, (24, 16 * t * 3), generator=torch.Generator().manual_seed(t), dtype=torch.uint8)
    p = int4_layout.pack(q, t)
    assert p.shape == (3, 3, 32, t // 2) and p.dtype == torch.int32
    assert torch.equal(int4_layout.unpack(p), q)


@pytest.mark.parametrize("t", int4_layout.INNER_K_TILES)
def test_each_word_lies_in_one_32_column_block(t):
    """What lets one (scale, zero) serve a whole word at any group size >= 32."""
    cols = int4_layout.column_offsets(t)
    assert sorted(cols.flatten().tolist()) == list(range(16 * t))  # every column once
    assert ((cols // 32) == (cols[:, :1] // 32)).all()


def test_row_words_are_contiguous_per_super_tile():
    """Row n's words of super-tile s sit at [n // 8, s, 4 (n % 8) .. 4 (n % 8) + 3, :]."""
    q = torch.zeros(16, 256, dtype=torch.uint8)
    q[11, 128:256] = 15  # row 11, super-tile 1 (T = 8: 128 columns)
    p = int4_layout.pack(q, 8)
    hit = (p != 0).nonzero().tolist()
    assert {(a, b) for a, b, _, _ in hit} == {(1, 1)} and {c for _, _, c, _ in hit} == {12, 13, 14, 15}


def test_bad_shapes_are_refused():
    with pytest.raises(ValueError, match="inner_k_tiles"):
        int4_layout.pack(torch.zeros(8, 64, dtype=torch.uint8), 3)
    with pytest.raises(ValueError, match="N % 8"):
        int4_layout.pack(torch.zeros(12, 64, dtype=torch.uint8), 2)


@needs_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("t", int4_layout.INNER_K_TILES)
def test_equals_torchs_converter(t):
    from augury.layers.quant_linear import _pack_fn

    q = torch.randint(0, 16, (64, 512), generator=torch.Generator().manual_seed(1), dtype=torch.int32)
    want = _pack_fn("cuda", t)(q.cuda())
    assert torch.equal(int4_layout.pack(q.cuda(), t), want)
