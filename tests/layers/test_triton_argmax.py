"""The Triton argmax of decode bursts equals torch.argmax exactly: ties, NaN, signed zeros, -inf rows.

Runs under TRITON_INTERPRET=1 on the CPU; on a CUDA machine the same checks run compiled."""

from __future__ import annotations

import pytest
import torch

from tests.triton_env import interpreter, rerun_in_fresh_process  # noqa: E402

CPU, FRESH = interpreter()

from augury.layers import triton_argmax as ta  # noqa: E402
from augury.layers.triton_splitkv import split_counters  # noqa: E402

here = pytest.mark.skipif(not FRESH, reason="triton was imported before the interpreter was on: test_in_fresh_process runs these")
cuda_only = pytest.mark.skipif(CPU, reason="needs a CUDA device")
DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _rows(B, V, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(B, V, generator=g) * 4).to(dtype)
    # the row maximum repeated further on, in another program's slice and at the very end
    top = x.float().max(-1).values
    for b in range(B):
        for k in (3, V // 2, V - 1):
            x[b, k] = top[b].to(dtype)
    return x.to(DEV)


@here
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("B,V", [(1, 13000), (3, 4096), (2, 100), (4, 8193)])
def test_equals_torch_argmax_with_ties(dtype, B, V):
    x = _rows(B, V, dtype, seed=B * V)
    want = x.float().argmax(-1)
    assert torch.equal(ta.argmax_rows(x), want)
    assert (want == 3).all()  # the ties went to the lowest index
    assert not split_counters(x.device, owner="argmax").any()  # every launch leaves them at 0


@here
def test_nan_signed_zero_and_all_minus_inf_rows():
    x = torch.full((4, 9000), -1.0)
    x[0, 7000] = float("nan")  # NaN is larger than anything: torch returns the first one
    x[0, 8000] = float("nan")
    x[0, 100] = float("inf")
    x[1] = -0.0  # -0.0 and +0.0 are equal: the lowest index wins
    x[1, 5000] = 0.0
    x[2] = float("-inf")
    x[3, 6000] = -0.5  # the maximum is negative
    x[3, 2000] = -0.5
    x = x.to(DEV)
    want = x.argmax(-1)
    assert want.tolist() == [7000, 0, 0, 2000]
    assert torch.equal(ta.argmax_rows(x), want)
    assert torch.equal(ta.argmax_rows(x.to(torch.bfloat16)), want)


@here
def test_writes_into_out_and_strided_rows():
    x = _rows(3, 6000, torch.bfloat16, seed=7)
    wide = torch.zeros(3, 6100, dtype=torch.bfloat16, device=DEV)
    wide[:, :6000] = x
    wide[:, 6000:] = 100.0  # outside the view: must not be read
    view = wide[:, :6000]
    out = torch.full((2, 3), -1, dtype=torch.long, device=DEV)
    got = ta.argmax_rows(view, out=out[1])
    assert got.data_ptr() == out[1].data_ptr()
    assert torch.equal(out[1], x.float().argmax(-1)) and (out[0] == -1).all()


@here
def test_without_counters_one_program_walks_each_row(monkeypatch):
    # what a CUDA-graph capture that finds no counter buffer gets: still torch's answer
    monkeypatch.setattr(ta, "split_counters", lambda *a, **k: None)
    x = _rows(2, 13000, torch.float32, seed=9)
    assert torch.equal(ta.argmax_rows(x), x.argmax(-1))


@here
def test_bad_arguments_are_clear_errors():
    x = torch.zeros(2, 50, device=DEV)
    with pytest.raises(ValueError, match="int64"):
        ta.argmax_rows(x, out=torch.zeros(2, dtype=torch.int32, device=DEV))
    with pytest.raises(ValueError, match=r"\[B, V\]"):
        ta.argmax_rows(torch.zeros(50, device=DEV))
    with pytest.raises(ValueError, match=r"\[B, V\]"):
        ta.argmax_rows(torch.zeros(2, 50, dtype=torch.int32, device=DEV))


@cuda_only
def test_graph_replays_follow_new_logits():
    x = _rows(1, 128256, torch.bfloat16, seed=11)
    out = torch.empty(1, dtype=torch.long, device=DEV)
    ta.argmax_rows(x, out=out)  # counters created outside the capture
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.cuda.graph(graph):
        ta.argmax_rows(x, out=out)
    for seed in range(20):
        x.copy_(_rows(1, 128256, torch.bfloat16, seed=100 + seed))
        x[0, seed * 6000 + 17] = 1000.0
        graph.replay()
        assert out.item() == seed * 6000 + 17
    assert not split_counters(DEV, owner="argmax").any()


@pytest.mark.skipif(FRESH, reason="this process runs the checks itself")
def test_in_fresh_process():
    rerun_in_fresh_process(__file__, timeout=900)
