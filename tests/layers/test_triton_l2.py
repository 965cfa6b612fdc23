"""L2 warming (augury.layers.triton_l2): the host plan, and on CUDA that attention asked to
prefetch a weight returns bitwise what it returns without (a prefetch is only a hint)."""

from __future__ import annotations

import pytest
import torch

from augury.layers.triton_l2 import prefetch_plan, prefetch_supported


@pytest.mark.parametrize("nbytes,programs,threads", [(33_554_432, 72, 128), (1000, 72, 128), (16, 1, 32),
                                                     (12_345_678, 9, 64)])
def test_plan_covers_the_bytes_in_16_byte_chunks(nbytes, programs, threads):
    chunk = prefetch_plan(nbytes, programs, threads)
    assert chunk % 16 == 0 and chunk >= 16
    assert chunk * programs * threads >= nbytes  # every byte has a chunk
    assert (chunk - 16) * programs * threads < nbytes or chunk == 16  # and no chunk is needlessly long


def test_not_on_the_cpu():
    assert not prefetch_supported(torch.device("cpu"))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("at", [1, 2])
def test_attention_with_prefetch_is_bitwise_the_same(at):
    from augury.bench.kernels_gpu import _attention_case
    from augury.layers.triton_paged_decode import paged_decode_attention

    dev, dt = torch.device("cuda"), torch.bfloat16
    gm, n_slots = _attention_case(1, 1024, 1, 32, 8, 128, dev, dt)
    kp, vp = (torch.randn(n_slots, 8, 128, device=dev, dtype=dt) for _ in range(2))
    q = torch.randn(1, 1, 32, 128, device=dev, dtype=dt)
    w = torch.randn(4096, 4096 + 8, device=dev, dtype=dt)  # rows of a size not a multiple of the chunks
    bias = gm.additive_mask(dt)
    ref = paged_decode_attention(q, kp, vp, gm.gather_slots, bias, 128 ** -0.5)
    got = paged_decode_attention(q, kp, vp, gm.gather_slots, bias, 128 ** -0.5, l2_prefetch=w, l2_prefetch_at=at)
    assert torch.equal(ref, got)
    with pytest.raises(ValueError, match="contiguous"):
        paged_decode_attention(q, kp, vp, gm.gather_slots, bias, 128 ** -0.5, l2_prefetch=w[:, :4096])
