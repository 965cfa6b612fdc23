"""The native int8 product: matches the float64 product, each row's bits are its lone call's whatever
the rows beside it or the thread count, bad shapes are clear errors, and Int8Linear's few-row CPU
steps route to it."""

from __future__ import annotations

import pytest
import torch

import augury.layers.quant_linear as ql
from augury.layers.quant_linear import INT8_DENSE_MIN_ROWS, Int8Linear

pytestmark = pytest.mark.usefixtures("native")


def _case(M: int, N: int, K: int, scale_dtype: torch.dtype, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, K, generator=g).bfloat16().float()  # bf16 values: every product exact in float32
    w = torch.randint(-127, 128, (N, K), generator=g, dtype=torch.int8)
    s = (torch.rand(N, generator=g) + 0.01).to(scale_dtype)
    return x, w, s


@pytest.mark.parametrize("scale_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("M,N,K", [(1, 3072, 576), (7, 50, 48), (3, 33, 16), (15, 70, 1536)])
def test_matches_float64(M: int, N: int, K: int, scale_dtype: torch.dtype) -> None:
    x, w, s = _case(M, N, K, scale_dtype, seed=M + N + K)
    y = torch.ops.augury_cpu.int8_mm(x, w, s)
    assert y.shape == (M, N) and y.dtype == torch.float32
    ref = (x.double() @ w.double().T) * s.double()
    bound = (x.double().abs() @ w.double().abs().T) * s.double() * K * 2 ** -24  # float32 sums of K terms
    assert ((y.double() - ref).abs() <= bound).all()


def test_rows_and_threads_do_not_change_a_bit() -> None:
    x, w, s = _case(9, 300, 96, torch.bfloat16, seed=3)
    y = torch.ops.augury_cpu.int8_mm(x, w, s)
    alone = torch.cat([torch.ops.augury_cpu.int8_mm(x[i:i + 1].contiguous(), w, s) for i in range(9)])
    assert torch.equal(alone, y)  # a verify-window row gets its lone decode step's bits
    assert torch.equal(torch.ops.augury_cpu.int8_mm(x[2:7].contiguous(), w, s), y[2:7])
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = torch.ops.augury_cpu.int8_mm(x, w, s)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, y)


def test_bad_shapes_are_clear_errors() -> None:
    x, w, s = _case(2, 8, 32, torch.float32)
    with pytest.raises(RuntimeError, match="multiple of 16"):
        torch.ops.augury_cpu.int8_mm(x[:, :24].contiguous(), w[:, :24].contiguous(), s)
    with pytest.raises(RuntimeError, match="K"):
        torch.ops.augury_cpu.int8_mm(x, w[:, :16].contiguous(), s)
    with pytest.raises(RuntimeError, match="scales"):
        torch.ops.augury_cpu.int8_mm(x, w, s[:4].contiguous())
    with pytest.raises(RuntimeError, match="float32"):
        torch.ops.augury_cpu.int8_mm(x.double(), w, s)


@pytest.mark.parametrize("act_dtype", [torch.bfloat16, torch.float32])
def test_module_routes_few_rows_to_the_kernel(monkeypatch: pytest.MonkeyPatch, act_dtype: torch.dtype) -> None:
    lin = torch.nn.Linear(100, 40, bias=True)  # K = 100: padded to 112 inside
    m = Int8Linear.from_linear(lin, act_dtype)
    calls = []
    op = torch.ops.augury_cpu.int8_mm

    class Spy:
        def __call__(self, *a):
            calls.append(tuple(a[0].shape))
            return op(*a)

    monkeypatch.setattr(torch.ops.augury_cpu, "int8_mm", Spy())
    x = torch.randn(3, 100)
    y = m(x)
    assert calls == [(3, 112)] and y.dtype == x.dtype and y.shape == (3, 40)
    ref = x.to(act_dtype).double() @ m.dequantize().double().T + lin.bias.double()
    tol = 1e-5 if act_dtype == torch.float32 else 2e-2
    torch.testing.assert_close(y.double(), ref, rtol=tol, atol=tol)
    m(torch.randn(INT8_DENSE_MIN_ROWS, 100))  # prefill-sized: the dense slices, not the kernel
    assert len(calls) == 1
    monkeypatch.setattr(ql, "_native_int8", lambda: False)  # torch's kernel, as without the library
    torch.testing.assert_close(m(x).double(), ref, rtol=tol, atol=tol)
    assert len(calls) == 1
