"""The native RMS normalization: matches the float64 formula, rows are bitwise their lone call, and
RMSNorm (both flavours) routes to it on the CPU when the kernels are loaded."""

from __future__ import annotations

import pytest
import torch

import augury.layers.norm as norm_mod
from augury.layers.norm import RMSNorm

pytestmark = pytest.mark.usefixtures("native")


@pytest.mark.parametrize("d", [576, 64, 100, 7])  # 100, 7: the scalar tail
def test_matches_float64_and_rows_are_invariant(d: int) -> None:
    x = torch.randn(9, d, generator=torch.Generator().manual_seed(d)) * 3
    y = torch.ops.augury_cpu.rms_norm(x, 1e-6)
    ref = x.double() / torch.sqrt(x.double().pow(2).mean(-1, keepdim=True) + 1e-6)
    assert torch.allclose(y.double(), ref, rtol=1e-5, atol=1e-6)
    alone = torch.cat([torch.ops.augury_cpu.rms_norm(x[i:i + 1].contiguous(), 1e-6) for i in range(9)])
    assert torch.equal(alone, y)


@pytest.mark.parametrize("gemma", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_module_routes_to_the_kernel(monkeypatch: pytest.MonkeyPatch, gemma: bool, dtype: torch.dtype) -> None:
    n = RMSNorm((3, 64), 1e-5, gemma_style=gemma, dtype=dtype)  # per-head weights over [T, heads, D], as fused q/k norms
    with torch.no_grad():
        n.weight.normal_()
    x = torch.randn(5, 3, 64).to(dtype)
    calls = []
    op = torch.ops.augury_cpu.rms_norm

    class Spy:
        def __call__(self, *a):
            calls.append(a[0].shape)
            return op(*a)

    monkeypatch.setattr(torch.ops.augury_cpu, "rms_norm", Spy())
    y = n(x)
    assert calls == [(15, 64)] and y.dtype == dtype and y.shape == x.shape
    h = x.double() / torch.sqrt(x.double().pow(2).mean(-1, keepdim=True) + 1e-5)
    ref = h * (1 + n.weight.double()) if gemma else n.weight.double() * h
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    assert torch.allclose(y.double(), ref, rtol=tol, atol=tol)
    monkeypatch.setattr(norm_mod, "_NATIVE", False)
    assert torch.allclose(n(x).double(), ref, rtol=tol, atol=tol)  # torch's path: the same function
