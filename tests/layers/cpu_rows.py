"""Shared set-up of the CPU few-query attention tests (test_attention_invariance.py,
test_attention_decode_cpu.py): SmolLM2's attention shape over a random paged pool."""

from __future__ import annotations

import random

import torch

from augury.layers.attention import GroupAttnMeta, SeqSpec, build_attention_metadata
from augury.layers.attention_decode_cpu import attend_decode_cpu, attend_rows_cpu

BS = 16
H, HKV, D = 9, 3, 64  # SmolLM2's attention shape


def table(n: int, seed: int, blocks: int) -> list[int]:
    """n distinct block ids drawn from 1..blocks-1 (block 0 stays unused)."""
    free = list(range(1, blocks))
    random.Random(seed).shuffle(free)
    return free[:n]


def pool(dtype: torch.dtype, seed: int, blocks: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(blocks * BS, HKV, D, generator=g).to(dtype),
            torch.randn(blocks * BS, HKV, D, generator=g).to(dtype))


def gmeta(specs: list[SeqSpec]) -> GroupAttnMeta:
    return build_attention_metadata(specs, BS, {"full": None}, "cpu").groups["full"]


def run(fn, q, kv, gm):
    pk, pv = kv
    return fn(q, lambda s: pk.index_select(0, s), lambda s: pv.index_select(0, s), gm, D ** -0.5)


def alone(q_row, kv, num_cached, tab):
    """The row's output as a one-token decode step of its own (dense, one request)."""
    gm = gmeta([SeqSpec(num_cached, 1, {"full": tab})])
    assert gm.dense and gm.max_q == 1
    return run(attend_decode_cpu, q_row, kv, gm)[0]


def window_equals_lone_steps(q, kv, num_cached, tab):
    """One request's verify window (q's rows after num_cached keys) through attend_rows_cpu: assert
    every row is bitwise its own one-token decode step; returns the window's output."""
    rows = q.shape[0]
    win = run(attend_rows_cpu, q, kv, gmeta([SeqSpec(num_cached, rows, {"full": tab})]))
    for j in range(rows):
        assert torch.equal(win[j], alone(q[j:j + 1], kv, num_cached + j, tab)), f"nc={num_cached} rows={rows} row {j}"
    return win


def rows_equal_lone_steps(got, q, kv, lens, specs):
    """A ragged step's output `got` (requests' rows in order; lens: (cached keys, rows) per request):
    assert every row is bitwise its own one-token decode step."""
    row = 0
    for (nc, nn), spec in zip(lens, specs):
        for j in range(nn):
            assert torch.equal(got[row], alone(q[row:row + 1], kv, nc + j, spec.block_tables["full"])), (nc, j)
            row += 1
