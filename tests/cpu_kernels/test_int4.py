"""The native int4 x int8 matmul: its arithmetic against a torch reference, bitwise row and
thread invariance (what keeps speculative verify windows exact), and the packing layout."""

from __future__ import annotations

import pytest
import torch
from native_child import outputs_in_child

from augury.cpu_kernels import load
from augury.cpu_kernels.int4 import BLOCK, int4_mm, pack_int4, pack_nibbles
from augury.layers.quant_linear import dequantize_int4, quantize_int4, unpack_int4

pytestmark = pytest.mark.usefixtures("native")


def _weights(n: int, k: int, group: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) * 0.05
    q, s, z = quantize_int4(w, group)
    return q, s, z


def _reference(x: torch.Tensor, q: torch.Tensor, s: torch.Tensor, z: torch.Tensor, group: int) -> torch.Tensor:
    """The kernel's arithmetic in float64 from its own int8 activations (so only fp32 rounding differs)."""
    m, k = x.shape
    xb = x.view(m, k // BLOCK, BLOCK)
    amax = xb.abs().amax(-1, keepdim=True)
    inv = torch.where(amax > 0, torch.tensor(127.0) / amax, torch.zeros_like(amax))
    qx = torch.round(xb * inv).double()  # round half to even, as the kernel's conversion
    d = (amax / 127.0).double()
    sb = s.double().to(torch.bfloat16).double().repeat_interleave(group // BLOCK, 1)  # [N, K/32]
    zb = z.double().to(torch.bfloat16).double().repeat_interleave(group // BLOCK, 1)
    qw = q.double().view(q.shape[0], k // BLOCK, BLOCK)
    acc = torch.einsum("mbi,nbi->mnb", qx, qw)  # [M, N, K/32]
    S = qx.sum(-1)  # [M, K/32]
    return ((acc - 8 * S[:, None]) * sb[None] * d.squeeze(-1)[:, None] + zb[None] * (d.squeeze(-1) * S)[:, None]).sum(-1)


@pytest.mark.parametrize("n,k,group", [(16, 32, 32), (64, 96, 32), (960, 576, 32), (48, 256, 64), (32, 512, 128)])
@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 9])
def test_matches_reference(n: int, k: int, group: int, m: int) -> None:
    q, s, z = _weights(n, k, group)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
    x[0, :BLOCK] = 0.0  # an all-zero activation block (scale 0) must not produce NaN
    y = int4_mm(x, *pack_int4(q, s, z), group)
    ref = _reference(x, q, s, z, group)
    assert torch.allclose(y.double(), ref, rtol=1e-5, atol=1e-5), (y.double() - ref).abs().max()
    # and the whole thing approximates the float product (int8 activations: ~1% of the output scale)
    exact = x @ dequantize_int4(q, s.to(torch.bfloat16).float(), z.to(torch.bfloat16).float(), group).T
    assert (y - exact).abs().max() <= 0.02 * exact.abs().max()


def test_rows_are_bitwise_their_lone_call_whatever_the_batch_or_threads() -> None:
    q, s, z = _weights(3072, 576, 32, seed=1)
    p, sz = pack_int4(q, s, z)
    x = torch.randn(11, 576, generator=torch.Generator().manual_seed(3))
    alone = torch.cat([int4_mm(x[i:i + 1].contiguous(), p, sz, 32) for i in range(11)])
    for rows in (2, 3, 4, 5, 8, 11):
        assert torch.equal(int4_mm(x[:rows].contiguous(), p, sz, 32), alone[:rows])
    # a row's place in the batch does not matter either
    perm = torch.randperm(11, generator=torch.Generator().manual_seed(4))
    assert torch.equal(int4_mm(x[perm].contiguous(), p, sz, 32), alone[perm])
    n = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(int4_mm(x, p, sz, 32), alone)
    finally:
        torch.set_num_threads(n)


@pytest.mark.parametrize("threads", [2, 3, 4])
def test_work_stealing_changes_no_bit(threads) -> None:
    """The tiles are shared out by parallel_steal (kernels.h): a thread that finishes its share early
    takes chunks of the others'. Every tile must still be computed exactly once, with the bits of the
    static split (its A/B hook, augury_cpu::set_steal) and of one thread. Tile counts from 2 (fewer
    than 16 chunks a share) to 192 (SmolLM2's gate_up), rows 1, 8 and 11."""
    cases = []
    for n, k, m in [(32, 576, 1), (960, 576, 8), (3072, 576, 11), (576, 1536, 8)]:
        q, s, z = _weights(n, k, 32, seed=n + m)
        cases.append((torch.randn(m, k, generator=torch.Generator().manual_seed(k + m)), *pack_int4(q, s, z)))
    n0 = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        serial = [int4_mm(x, p, sz, 32) for x, p, sz in cases]
        torch.set_num_threads(threads)
        for steal in (True, False):
            torch.ops.augury_cpu.set_steal(steal)
            for (x, p, sz), want in zip(cases, serial):
                assert torch.equal(int4_mm(x, p, sz, 32), want), (steal, x.shape, p.shape)
    finally:
        torch.ops.augury_cpu.set_steal(True)
        torch.set_num_threads(n0)


def test_software_prefetch_changes_no_bit(tmp_path) -> None:
    """The SIMD paths ask for weight blocks ahead of use (AUGURY_INT4_PREFETCH, read once per process on
    the VNNI path): a hint, so with it off (a child process) every output is bitwise the same. Rows 1, 8
    and 17 (one row chunk, a full one, and chunks past the first, which skip the hint); K 576 and 1536
    (the prefetch runs past a tile's end into the next tile and past the tensor's end)."""
    calls = []
    for n, k, group, m in [(960, 576, 32, 1), (960, 576, 32, 17), (64, 1536, 64, 8), (48, 1536, 32, 1)]:
        q, s, z = _weights(n, k, group, seed=m)
        x = torch.randn(m, k, generator=torch.Generator().manual_seed(k + m))
        calls.append((x, *pack_int4(q, s, z), group))
    here = [int4_mm(*a) for a in calls]
    off = outputs_in_child("augury.cpu_kernels.int4:int4_mm", calls, {"AUGURY_INT4_PREFETCH": "0"}, tmp_path)
    for a, b in zip(here, off):
        assert torch.equal(a, b)


def test_the_build_names_its_path() -> None:
    """int4_mm has an AVX-512 VNNI path, an AVX2 one (vpdpbusd's sums through vpmaddubsw and
    vpmaddwd) and a portable one; the build reports which it compiled (`-march=native`), and x86
    machines with AVX2 never fall back to the portable loop (~4x slower decode)."""
    import platform

    isa = torch.ops.augury_cpu.int4_isa()
    assert isa in ("avx512vnni", "avx2", "portable")
    assert (isa == "avx512vnni") == torch.ops.augury_cpu.int4_has_vnni()
    flags = open("/proc/cpuinfo").read() if platform.system() == "Linux" else ""
    if " avx2 " in flags and " fma " in flags:
        assert isa != "portable"


def test_packing_only_moves_nibbles() -> None:
    """unpack_int4's layout-agnostic inverse recovers q from the native packing."""
    q, _, _ = _weights(48, 128, 32)
    assert torch.equal(unpack_int4(pack_nibbles(q.to(torch.int32)), "cpu-native", 0, 48, 128), q)


def test_bad_shapes_are_clear_errors() -> None:
    q, s, z = _weights(16, 64, 32)
    p, sz = pack_int4(q, s, z)
    with pytest.raises(RuntimeError, match="columns"):
        int4_mm(torch.randn(1, 32), p, sz, 32)
    with pytest.raises(ValueError, match="N % 16"):
        pack_nibbles(torch.zeros(10, 64, dtype=torch.uint8))
    # a group is 32 times a power of two (the kernel finds a block's group by a shift)
    q, s, z = _weights(16, 192, 96)
    p, sz = pack_int4(q, s, z)
    with pytest.raises(RuntimeError, match="power of two"):
        int4_mm(torch.randn(1, 192), p, sz, 96)
    assert load()
