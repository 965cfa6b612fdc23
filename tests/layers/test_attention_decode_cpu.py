"""CPU few-query attention (layers/attention_decode_cpu.py): the bucketed, newest-first row computation.

Exactness: every row of a window, of a decode batch or of a ragged batch is bitwise the lone one-token
step's output for that row, across many key counts (bucket boundaries included) and window sizes
1..11. Correctness: the lone step agrees with float64 attention. Speed structure: a window whose rows
fall in one key-count bucket runs as ONE matmul group (what makes windows cheaper than row by row).
"""

import random

import pytest
import torch

from augury.layers import attention_decode_cpu as adc
from augury.layers.attention import SeqSpec
from augury.layers.attention_decode_cpu import BUCKET, attend_rows_cpu

from tests.layers import cpu_rows
from tests.layers.cpu_rows import BS, D, H, HKV

BLOCKS = 400
SLOTS = BLOCKS * BS


def _table(n: int, seed: int) -> list[int]:
    return cpu_rows.table(n, seed, BLOCKS)


def _pool(dtype, seed=0):
    return cpu_rows.pool(dtype, seed, BLOCKS)


_gmeta, _run, _alone = cpu_rows.gmeta, cpu_rows.run, cpu_rows.alone


def _lengths():
    """Cached-key counts around bucket boundaries and a few random ones."""
    edges = [k * BUCKET + d for k in (1, 2, 8, 19) for d in (-2, -1, 0, 1)]
    return sorted(set([0, 1, 2] + edges + random.Random(5).sample(range(3, 700), 12)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_window_rows_equal_lone_steps_bitwise(dtype):
    pool = _pool(dtype)
    table = _table(50, 1)
    g = torch.Generator().manual_seed(2)
    for nc in _lengths():
        for rows in range(1, 12):
            cpu_rows.window_equals_lone_steps(torch.randn(rows, H, D, generator=g).to(dtype), pool, nc, table)


def test_bf16_pool_fp32_queries():
    """The engine's usual CPU mix may gather half-precision keys for fp32 activations."""
    pool = _pool(torch.bfloat16, 9)
    table = _table(30, 4)
    q = torch.randn(6, H, D, generator=torch.Generator().manual_seed(3))
    for nc in (31, 200, 377):
        assert cpu_rows.window_equals_lone_steps(q, pool, nc, table).dtype == torch.float32


def test_decode_batch_rows_equal_lone_steps_bitwise():
    """One token for each of several requests of different lengths (a small decode batch)."""
    pool = _pool(torch.float32, 3)
    lens = [5, 300, 15, 16, 17, 129, 64, 1]
    specs = [SeqSpec(nc, 1, {"full": _table(25, 20 + i)}) for i, nc in enumerate(lens)]
    q = torch.randn(len(lens), H, D, generator=torch.Generator().manual_seed(4))
    got = _run(attend_rows_cpu, q, pool, _gmeta(specs))
    for i, (nc, spec) in enumerate(zip(lens, specs)):
        assert torch.equal(got[i], _alone(q[i:i + 1], pool, nc, spec.block_tables["full"])), nc


@pytest.mark.parametrize("split", [False, True])
def test_ragged_windows_equal_lone_steps_bitwise(split):
    """Decodes and windows of several requests in one step, as one padded segment or as the
    runner's two segments (decodes first)."""
    pool = _pool(torch.float32, 6)
    lens = [(46, 1), (7, 1), (130, 11), (14, 4), (3, 2), (250, 5)]
    specs = [SeqSpec(nc, nn, {"full": _table(25, 40 + i)}) for i, (nc, nn) in enumerate(lens)]
    gm = _gmeta(specs)
    q = torch.randn(sum(nn for _, nn in lens), H, D, generator=torch.Generator().manual_seed(7))
    if split:
        assert gm.parts is not None
        got = torch.cat([_run(attend_rows_cpu, q[lo:hi], pool, part) for lo, hi, part in gm.parts])
    else:
        gm.parts = None
        got = _run(attend_rows_cpu, q, pool, gm)
    cpu_rows.rows_equal_lone_steps(got, q, pool, lens, specs)


@pytest.mark.parametrize("nc", [0, 6, 15, 16, 33, 299])
def test_lone_step_matches_float64_attention(nc):
    pool = _pool(torch.float32, 11)
    table = _table(25, 8)
    q = torch.randn(1, H, D, generator=torch.Generator().manual_seed(12))
    got = _alone(q, pool, nc, table)
    slots = torch.tensor([table[p // BS] * BS + p % BS for p in range(nc + 1)])
    k = pool[0][slots].double().repeat_interleave(H // HKV, 1)  # [L, H, D]
    v = pool[1][slots].double().repeat_interleave(H // HKV, 1)
    w = torch.softmax(torch.einsum("hd,lhd->hl", q[0].double(), k) * D ** -0.5, -1)
    torch.testing.assert_close(got.double(), torch.einsum("hl,lhd->hd", w, v), atol=1e-5, rtol=1e-5)


def test_keys_outside_the_request_are_never_read():
    """Padding repeats the request's own oldest key and is masked: poison every other slot."""
    pk, pv = _pool(torch.float32, 13)
    table = _table(25, 14)
    nc, rows = 37, 7
    used = torch.zeros(SLOTS, dtype=torch.bool)
    for p in range(nc + rows):
        used[table[p // BS] * BS + p % BS] = True
    pk[~used], pv[~used] = float("nan"), float("nan")
    q = torch.randn(rows, H, D, generator=torch.Generator().manual_seed(15))
    got = _run(attend_rows_cpu, q, (pk, pv), _gmeta([SeqSpec(nc, rows, {"full": table})]))
    assert torch.isfinite(got).all()
    assert torch.isfinite(_alone(q[:1], (pk, pv), nc, table)).all()


def test_window_in_one_bucket_is_one_matmul_group():
    """The speed-up itself: rows whose key counts share a bucket run as one bmm pair over
    rows x Hkv entries; a window straddling a bucket boundary takes two."""
    inside = _gmeta([SeqSpec(2 * BUCKET, 8, {"full": _table(10, 1)})])  # keys 33..40
    plan = adc._row_plan(inside)
    assert [(g.rows, g.keys) for g in plan.groups] == [(8, 3 * BUCKET)]
    straddle = _gmeta([SeqSpec(2 * BUCKET - 3, 8, {"full": _table(10, 1)})])  # keys 30..37
    assert sorted((g.rows, g.keys) for g in adc._row_plan(straddle).groups) == [(3, 2 * BUCKET), (5, 3 * BUCKET)]
    batch = _gmeta([SeqSpec(n, 1, {"full": _table(10, i)}) for i, n in enumerate((5, 90, 40))])
    assert len(adc._row_plan(batch).groups) == 3  # different requests never share a group
