"""Batch invariance of CPU attention: a query row's output computed inside a verify window or a
batch (attend_rows_cpu) is bitwise the one-token decode step's (attend_decode_cpu, row alone) —
what keeps speculative and batched greedy output identical to plain greedy."""

import pytest
import torch
import torch.nn.functional as F

from augury.layers.attention import SeqSpec, build_attention_metadata
from augury.layers.attention_decode_cpu import attend_rows_cpu

from tests.layers import cpu_rows
from tests.layers.cpu_rows import BS, D, H, HKV

BLOCKS = 200


def _table(n: int, seed: int) -> list[int]:
    return cpu_rows.table(n, seed, BLOCKS)


def _pool(dtype, seed=0):
    return cpu_rows.pool(dtype, seed, BLOCKS)


_gmeta, _run, _alone = cpu_rows.gmeta, cpu_rows.run, cpu_rows.alone


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_window_rows_equal_decode_steps_bitwise(dtype):
    pool = _pool(dtype)
    table = _table(60, 1)
    g = torch.Generator().manual_seed(2)
    # key counts across vector-width and block boundaries, windows up to past the verify maximum
    for nc in [0, 1, 15, 17, 33, 64, 127, 511]:
        for rows in (2, 5, 11, 16):
            cpu_rows.window_equals_lone_steps(torch.randn(rows, H, D, generator=g).to(dtype), pool, nc, table)


def test_ragged_batch_rows_equal_decode_steps_bitwise():
    """Requests with different window sizes and context lengths in one step (padded segments)."""
    pool = _pool(torch.float32, 3)
    lens = [(7, 4), (130, 11), (3, 2), (66, 1), (40, 1)]
    specs = [SeqSpec(nc, nn, {"full": _table(12, i)}) for i, (nc, nn) in enumerate(lens)]
    gm = _gmeta(specs)
    gm.parts = None  # one segment with padding (the runner would split off single-token decodes)
    q = torch.randn(sum(nn for _, nn in lens), H, D, generator=torch.Generator().manual_seed(4))
    got = _run(attend_rows_cpu, q, pool, gm)
    cpu_rows.rows_equal_lone_steps(got, q, pool, lens, specs)


def test_rows_agree_with_sdpa():
    pool = _pool(torch.float32, 5)
    lens = [(40, 3), (7, 4), (130, 11), (0, 2)]
    gm = _gmeta([SeqSpec(nc, nn, {"full": _table(12, 10 + i)}) for i, (nc, nn) in enumerate(lens)])
    q = torch.randn(sum(nn for _, nn in lens), H, D, generator=torch.Generator().manual_seed(6))
    got = _run(attend_rows_cpu, q, pool, gm)
    pk, pv = pool
    B, K = gm.gather_slots.shape
    kc = pk[gm.gather_slots.view(-1)].view(B, K, HKV, D).transpose(1, 2)
    vc = pv[gm.gather_slots.view(-1)].view(B, K, HKV, D).transpose(1, 2)
    qp = q.index_select(0, gm.q_index).view(B, gm.max_q, H, D).transpose(1, 2)
    want = F.scaled_dot_product_attention(qp, kc, vc, attn_mask=gm.mask, scale=D ** -0.5, enable_gqa=True)
    want = want.transpose(1, 2).reshape(B * gm.max_q, H, D).index_select(0, gm.out_index)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_sliding_window_is_refused():
    specs = [SeqSpec(3, 2, {"sliding": _table(2, 0)})]
    gm = build_attention_metadata(specs, BS, {"sliding": 4}, "cpu").groups["sliding"]
    with pytest.raises(ValueError, match="full-attention"):
        _run(attend_rows_cpu, torch.randn(2, H, D), _pool(torch.float32), gm)


def test_thread_count_is_restored_and_does_not_change_bits():
    pool = _pool(torch.float32, 7)
    table = _table(20, 3)
    q = torch.randn(5, H, D, generator=torch.Generator().manual_seed(8))
    gm = _gmeta([SeqSpec(90, 5, {"full": table})])
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        two = _run(attend_rows_cpu, q, pool, gm)
        assert torch.get_num_threads() == 2
        torch.set_num_threads(1)
        assert torch.equal(_run(attend_rows_cpu, q, pool, gm), two)
    finally:
        torch.set_num_threads(before)
