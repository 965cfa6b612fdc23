"""The native argmax against torch.argmax(x, -1): ties, signed zeros, infinities, NaN, every tail
length of the SIMD loops, and the sampler and model using it."""

from __future__ import annotations

import pytest
import torch

from augury.cpu_kernels.argmax import argmax_last

pytestmark = pytest.mark.usefixtures("native")


def _check(x: torch.Tensor) -> None:
    got = torch.ops.augury_cpu.argmax_rows(x.contiguous())
    assert got.dtype == torch.long and torch.equal(got, x.argmax(-1)), (got, x.argmax(-1))


@pytest.mark.parametrize("v", [1, 7, 8, 15, 16, 17, 31, 32, 63, 64, 65, 127, 200, 49152])
def test_random_rows_every_tail(v: int) -> None:
    g = torch.Generator().manual_seed(v)
    _check(torch.randn(5, v, generator=g))
    _check(torch.randint(-3, 3, (9, v), generator=g).float())  # many ties: the first index wins


def test_ties_zeros_infinities_and_nan() -> None:
    v = 130
    rows = []
    for at in (0, 1, 15, 16, 63, 64, 65, 129):
        r = torch.full((v,), -1.0)
        r[at] = 5.0
        r[min(at + 3, v - 1)] = 5.0  # a later tie
        rows.append(r)
    z = torch.full((v,), -1.0)
    z[40], z[20] = 0.0, -0.0  # -0.0 == 0.0: the first of them
    rows += [z, torch.full((v,), float("-inf")), torch.full((v,), 2.0)]
    inf = torch.randn(v)
    inf[77] = float("inf")
    rows.append(inf)
    for at in (0, 17, 70, 129):  # torch orders NaN above every number: the first NaN
        n = torch.randn(v)
        n[at] = float("nan")
        n[min(at + 5, v - 1)] = float("nan")
        n[3] = float("inf")
        rows.append(n)
    _check(torch.stack(rows))


def test_the_wrapper_routes_and_keeps_shapes() -> None:
    x = torch.randn(2, 3, 50)
    assert torch.equal(argmax_last(x), x.argmax(-1))
    assert torch.equal(argmax_last(x[0, 0]), x[0, 0].argmax(-1))  # one row
    xt = torch.randn(50, 4).T  # not contiguous
    assert torch.equal(argmax_last(xt), xt.argmax(-1))
    h = torch.randn(3, 40, dtype=torch.bfloat16)  # other dtypes: torch's op
    assert torch.equal(argmax_last(h), h.argmax(-1))


def test_the_sampler_and_the_model_take_it(monkeypatch) -> None:
    """Greedy rows in `sample` and the model's `greedy_ids` go through the native op (counted), with
    torch's answer."""
    import augury.cpu_kernels.argmax as mod
    from augury.engine.sampler import SamplingRow, greedy_tokens, sample
    from augury.engine.types import SamplingParams

    calls = []
    real = mod._rows
    monkeypatch.setattr(mod, "_rows", lambda x: calls.append(tuple(x.shape)) or real(x))
    logits = torch.randn(4, 1000)
    rows = [SamplingRow(SamplingParams(temperature=0.0), [], [], None) for _ in range(4)]
    out = sample(logits, rows)
    assert torch.equal(torch.as_tensor(out.token_ids).long(), logits.argmax(-1))
    assert torch.equal(greedy_tokens(logits, rows), logits.argmax(-1))
    assert calls == [(4, 1000), (4, 1000)]
