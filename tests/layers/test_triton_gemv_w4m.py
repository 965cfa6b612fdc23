"""The one-row int4 GEMV on the tensor cores (`triton_gemv_w4m`) equals the dequantized product, with
every prologue and epilogue, one or two tiles in flight, ragged row chunks, and `Int4Linear` builds its
layout from tinygemm's bytes under AUGURY_INT4_GEMV_LAYOUT=mma.

Runs under TRITON_INTERPRET=1 on the CPU, where the kernel emulates the warp-wide mma on the same
lane registers the PTX receives (so the layout, the lane roles and the offsets are checked here); on
a CUDA machine the same checks run compiled (the PTX itself), plus the 8B shapes against tinygemm,
PDL, and a captured CUDA graph."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from tests.triton_env import interpreter, rerun_in_fresh_process  # noqa: E402

CPU, FRESH = interpreter()

from augury.layers import int4_layout, triton_gemv_w4m  # noqa: E402
from augury.layers.quant_linear import dequantize_int4, quantize_int4  # noqa: E402
from augury.layers.triton_gemv import gemv  # noqa: E402
from augury.layers.triton_gemv_w4m import W4MmaConfig as M  # noqa: E402
from tests.layers.test_triton_gemv_int4 import DEV, _rand, cuda_only, here  # noqa: E402
from tests.layers.test_triton_gemv_w4r import LLAMA3_8B_SHAPES, matches_tinygemm  # noqa: E402


def _int4(n, k, seed):
    """-> (packed, scales, w): a random weight in this GEMV's layout and the fp32 weight it stands for
    (scale / zero rounded to bf16, as stored)."""
    w = _rand(n, k, seed=seed, scale=0.1).float().cpu()
    q, s, z = quantize_int4(w, 32)
    sz = torch.stack([s.T, z.T], -1).to(torch.bfloat16).contiguous()
    packed, scales = triton_gemv_w4m.pack(q, int4_layout.transpose_scales(sz))
    return packed.to(DEV), scales.to(DEV), dequantize_int4(q, sz[..., 0].T.float(), sz[..., 1].T.float(), 32).to(DEV)


def _close(y, ref):
    y, ref = y.float(), ref.float()
    torch.testing.assert_close(y, ref, atol=2 ** -6 * ref.abs().max().item(), rtol=0)


# (N, K, config): one block and several, one tile per warp and several, two tiles in flight, a ragged last
# chunk (rows past N), two warps, tiles pipelined through shared memory, the K-major launch order, the
# shape-based default, three and four tiles in flight, chunks of rows not a power of two (ragged: rows past N);
# then the persistent grid (3 programs a "multiprocessor" off CUDA: runs that cross K slices and row chunks, runs
# shorter than the tiles in flight, a ragged last chunk, one, two and four warps)
CASES = [(16, 256, M(16, 1)), (32, 512, M(32, 2)), (64, 512, M(64, 1, prefetch=2)), (80, 512, M(64, 1, prefetch=2)),
         (48, 256, M(32, 1)), (96, 768, M(64, 2, prefetch=2)), (80, 512, M(64, 1, stages=3)),
         (96, 768, M(32, 2, k_major=True)), (64, 256, None), (256, 256, M(192, 1, prefetch=3)),
         (128, 256, M(128, 1, prefetch=4)), (208, 512, M(128, 1, prefetch=4, k_major=True)),
         (256, 512, M(128, 2, prefetch=3, maxnreg=128)),  # the register cap: compiled only (ptxas), a no-op here
         (208, 512, M(128, 1, prefetch=2, l2_ahead=3, l2_first=2)),  # L2 hints (compiled only), past a ragged end
         (208, 512, M(128, 1, stages=3, l2_first=4)),
         (208, 512, M(128, 1, prefetch=2, weight_cache=0)), (96, 768, M(64, 2, weight_cache=1))]  # cache hints
PERSISTENT = [(256, 512, M(64, 1, persistent=1)), (96, 768, M(64, 2, prefetch=2, persistent=2)),
              (208, 512, M(128, 1, prefetch=4, persistent=1)), (128, 512, M(64, 4, prefetch=3, persistent=1)),
              (96, 768, M(64, 2, prefetch=2, persistent=2, weight_cache=1))]  # the persistent grid takes the hints
CASES += PERSISTENT


@here
@pytest.mark.parametrize("n,k,cfg", CASES)
def test_product_with_each_prologue_equals_the_dequantized_weight(n, k, cfg):
    dtype = torch.bfloat16
    packed, sz, w = _int4(n, k, seed=n + k)
    x = _rand(1, k, seed=1, dtype=dtype, scale=2.0)
    _close(gemv(x, packed, scales_zeros=sz, group_size=32, cfg=cfg), F.linear(x.float(), w))
    g, r = _rand(k, seed=2, dtype=dtype), _rand(1, n, seed=3, dtype=dtype)
    xn = (g * F.rms_norm(x.float(), (k,), None, 1e-5).to(dtype)).to(dtype)
    ref = F.linear(xn.float(), w).to(dtype).float() + r.float()
    _close(gemv(x, packed, scales_zeros=sz, group_size=32, norm_weight=g, eps=1e-5, residual=r, cfg=cfg), ref)
    gu = _rand(1, 2 * k, seed=4, dtype=dtype)
    act = (F.silu(gu[:, :k]) * gu[:, k:]).to(dtype)
    _close(gemv(gu, packed, scales_zeros=sz, group_size=32, silu_mul=True, cfg=cfg), F.linear(act.float(), w))


@here
@pytest.mark.parametrize("scale", [3e4, 1e-6, 0.0])
def test_inputs_far_from_one_and_zero_keep_their_precision(scale):
    """The power-of-two range scaling: inputs near fp16's top (the /16 groups included) and far below
    its normal range give the same relative precision; all-zero input gives zero."""
    packed, sz, w = _int4(32, 512, seed=5)
    x = _rand(1, 512, seed=6, dtype=torch.bfloat16, scale=scale)
    y = gemv(x, packed, scales_zeros=sz, group_size=32, cfg=M(32, 2))
    if scale == 0.0:
        assert torch.equal(y, torch.zeros_like(y))
    else:
        _close(y, F.linear(x.float(), w))


@here
def test_every_nibble_position_meets_its_own_column_and_group():
    """Each column's q unlike its neighbours' and each group's (scale, zero) unlike the others': one
    input at a time (a power of two: every product exact), each output must be that input times its
    own weight. A nibble, a lane role or a scale entry read as another's shows."""
    n, k = 16, 256
    r, c = torch.arange(n)[:, None], torch.arange(k)[None, :]
    q = ((r * 3 + c + 5 * (c // 8)) % 16).to(torch.uint8)
    s = (0.25 * (1 + (torch.arange(n)[:, None] + torch.arange(8)[None, :]) % 4)).to(torch.bfloat16).float()
    z = (0.125 * ((torch.arange(n)[:, None] * 2 + torch.arange(8)[None, :]) % 5)).to(torch.bfloat16).float()
    sz = torch.stack([s.T, z.T], -1).to(torch.bfloat16).contiguous()
    packed, scales = triton_gemv_w4m.pack(q, int4_layout.transpose_scales(sz))
    w = dequantize_int4(q, s, z, 32).to(DEV)
    for col in range(0, k, 5):  # every nibble position, lane role and group class among them
        x = torch.zeros(1, k, device=DEV, dtype=torch.bfloat16)
        x[0, col] = 2.0 ** (col % 5 - 2)
        y = gemv(x, packed.to(DEV), scales_zeros=scales.to(DEV), group_size=32, cfg=M(16, 1))
        assert torch.equal(y, F.linear(x.double(), w.double()).to(torch.bfloat16)), col


@here
@pytest.mark.parametrize("n_heads,hidden,cfg", [(4, 256, M(64, 1)), (4, 512, M(128, 2, prefetch=2)),
                                                (4, 512, M(128, 2, prefetch=2, persistent=1))])
def test_qkv_rope_kv_equals_its_product_rope_and_pool_write(n_heads, hidden, cfg):
    from tests.layers.test_triton_gemv_int4 import qkv_rope_kv_against_its_parts

    H, Hkv, D = n_heads, 2, 16
    packed, sz, _ = _int4((H + 2 * Hkv) * D, hidden, seed=7)
    q, qk, _, _ = qkv_rope_kv_against_its_parts(packed, sz, 32, H, Hkv, D, hidden, torch.bfloat16, cfg, seed=8)
    assert torch.equal(q.view(1, H, D), qk[:, :H])  # the same sums, whichever program adds them: bitwise


@here
@pytest.mark.parametrize("n,k,cfg", PERSISTENT[:2])
def test_persistent_grid_is_bitwise_the_grid_form(n, k, cfg):
    """The runs store the same partial sums as the grid's programs (every warp scales by the same max of its
    slice's inputs) and a chunk's slices are added in slice order whichever program finishes it: bitwise."""
    packed, sz, _ = _int4(n, k, seed=n + k)
    gu, r = _rand(1, 2 * k, seed=4, dtype=torch.bfloat16), _rand(1, n, seed=3, dtype=torch.bfloat16)
    for call in range(2):  # the second call finds the counters the first one reset
        got = gemv(gu, packed, scales_zeros=sz, group_size=32, silu_mul=True, residual=r, cfg=cfg)
        want = gemv(gu, packed, scales_zeros=sz, group_size=32, silu_mul=True, residual=r,
                    cfg=replace(cfg, persistent=0))
        assert torch.equal(got, want), call


def test_layout_round_trips_and_refusals():
    g = torch.Generator().manual_seed(0)
    q = torch.randint(0, 16, (32, 512), generator=g, dtype=torch.uint8)
    w = int4_layout.pack_mma(q)
    assert w.shape == (2, 2, 512) and torch.equal(int4_layout.unpack_mma(w), q)
    # lane 4 g + t = 6 (g 1, t 2), mma j = 5 of tile (block 1, row tile 0): rows 1 / 9, groups 2 / 6, column 10 / 11
    word = int(w[1, 0, (5 // 4) * 128 + 6 * 4 + 5 % 4]) & 0xFFFFFFFF
    nib = [(word >> 4 * b) & 15 for b in range(8)]
    c0 = 256 + 2 * 5
    assert nib == [q[1, c0 + 64], q[1, c0 + 192], q[9, c0 + 64], q[9, c0 + 192],
                   q[1, c0 + 65], q[1, c0 + 193], q[9, c0 + 65], q[9, c0 + 193]]
    sc = torch.randint(-2**31, 2**31 - 1, (32, 16), generator=g, dtype=torch.int32)
    ss = int4_layout.scales_mma(sc)
    assert ss.shape == (2, 2, 128) and torch.equal(int4_layout.unscales_mma(ss), sc)
    assert ss[1, 1, 6 * 4 + 3] == sc[16 + 9, 8 + 5]  # lane 6's entry c3: row g + 8, group 2 t + 1
    with pytest.raises(ValueError, match="N % 16"):
        int4_layout.pack_mma(q[:24])
    with pytest.raises(ValueError, match="K % 256"):
        int4_layout.pack_mma(q[:, :128])
    assert triton_gemv_w4m.supported(4096, 14336, 32) and not triton_gemv_w4m.supported(4096, 4096, 64)
    assert not triton_gemv_w4m.supported(4096, 4000, 32) and not triton_gemv_w4m.supported(4100, 4096, 32)


@here
def test_bad_configs_and_scales_are_refused():
    packed, sz, _ = _int4(64, 256, seed=11)
    x = _rand(1, 256, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="multiple of 16 x num_warps"):
        gemv(x, packed, scales_zeros=sz, group_size=32, cfg=M(32, 4))
    with pytest.raises(ValueError, match="prefetches 1 to 4"):
        gemv(x, packed, scales_zeros=sz, group_size=32, cfg=M(64, 1, prefetch=5))
    with pytest.raises(ValueError, match="weight_cache is 0"):
        gemv(x, packed, scales_zeros=sz, group_size=32, cfg=M(64, 1, weight_cache=3))
    with pytest.raises(ValueError, match="stages=1, late_launch=0"):
        gemv(x, packed, scales_zeros=sz, group_size=32, cfg=M(64, 1, persistent=1, stages=2))
    with pytest.raises(ValueError, match="W4MmaConfig"):
        from augury.layers.triton_gemv_w4r import W4RowsConfig

        gemv(x, packed, scales_zeros=sz, group_size=32, cfg=W4RowsConfig())
    with pytest.raises(ValueError, match="group 32"):
        gemv(x, packed, scales_zeros=sz, group_size=64)
    with pytest.raises(ValueError, match="int32 scales"):
        gemv(x, packed, scales_zeros=sz[:, :, :64].contiguous(), group_size=32)


@here
def test_int4_linear_builds_the_mma_layout_from_tinygemm_bytes(monkeypatch):
    from tests.layers.test_triton_gemv_w4r import int4_linear_from_tinygemm_bytes

    for n, k, mma in ((32, 512, True), (48, 64, False)):  # K of whole 256-column blocks; not: the row layout
        lin = int4_linear_from_tinygemm_bytes(n, k, "mma", monkeypatch)
        got = lin.gemv_weight()
        assert (got["w"].dim() == 3) == mma
        if mma:
            assert torch.equal(int4_layout.unpack_mma(lin.gemv_packed).cpu(), lin.unpack())
            assert torch.equal(int4_layout.unscales_mma(lin.gemv_scales),
                               int4_layout.transpose_scales(lin.scales_zeros))
        x = _rand(1, k, seed=10, dtype=torch.bfloat16)
        _close(gemv(x, **got), F.linear(x.float(), lin.dequantize().to(DEV).float()))


@here
def test_fused_int4_layer_on_the_mma_layout_equals_the_dequantized_modules(monkeypatch):
    """The fused decode layer of a tiny int4 Llama whose every projection fits the mma layout (K of
    whole 256-column blocks) runs on it and equals the dequantized twin."""
    from augury.layers import fused_decode, quant_linear
    from tests.layers.test_triton_gemv_int4 import fused_int4_layer_check

    monkeypatch.setattr(quant_linear, "_INT4_GEMV_ON", True)
    monkeypatch.setattr(quant_linear, "_INT4_GEMV_LAYOUT", "mma")
    # attention asking the L2 for o_proj's weight (compiled, which passes no hints: bitwise the eager step); off
    # CUDA the hints are dropped, so there the warming run alone covers the plumbing
    for warm in (False, True) if DEV.type == "cuda" else (True,):
        monkeypatch.setattr(fused_decode, "_WARM_O", warm)
        m = fused_int4_layer_check(hidden=256, inter=256)
        assert all(getattr(getattr(layer, o), n).gemv_packed.dim() == 3 for layer in m.layers
                   for o, n in (("self_attn", "qkv_proj"), ("self_attn", "o_proj"), ("mlp", "gate_up_proj"),
                                ("mlp", "down_proj")))


# ---------------------------------------------------------------------------- CUDA only


@cuda_only
@pytest.mark.parametrize("n,k", LLAMA3_8B_SHAPES)
def test_llama3_8b_shapes_match_tinygemm(n, k, monkeypatch):
    assert matches_tinygemm(n, k, "mma", monkeypatch).gemv_packed.dim() == 3


@cuda_only
def test_late_launch_under_pdl_is_bitwise_the_plain_launch():
    from tests.layers.test_triton_gemv_w4r import late_launch_check

    late_launch_check(_int4, replace(triton_gemv_w4m.default_config(28672, 4096), late_launch=True))


@cuda_only
def test_replays_in_a_cuda_graph():
    from tests.layers.test_triton_gemv_int4 import replays_in_a_cuda_graph

    packed, sz, _ = _int4(6144, 4096, seed=10)  # several K slices per chunk: the counters reset each replay
    replays_in_a_cuda_graph(packed, sz)


@cuda_only
@pytest.mark.parametrize("n,k", LLAMA3_8B_SHAPES[:4])  # the layer products
def test_llama3_8b_shapes_persistent_are_bitwise_the_grid_form(n, k):
    """On the H200's own multiprocessor count, three and four programs a multiprocessor, two and four tiles in
    flight, evict-first and plain weight loads: the 8B shapes' persistent products equal the grid form's bit for
    bit."""
    packed, sz, _ = _int4(n, k, seed=n % 97)
    x = _rand(1, k, seed=5, dtype=torch.bfloat16)
    base = triton_gemv_w4m.default_config(n, k)
    want = gemv(x, packed, scales_zeros=sz, group_size=32, cfg=replace(base, persistent=0))
    for per_sm, pf, wc in ((4, 2, 2), (3, 4, 2), (4, 2, 0)):
        got = gemv(x, packed, scales_zeros=sz, group_size=32,
                   cfg=replace(base, persistent=per_sm, prefetch=pf, weight_cache=wc))
        assert torch.equal(got, want), (per_sm, pf, wc)


@cuda_only
@pytest.mark.parametrize("n,k", LLAMA3_8B_SHAPES[:4])
def test_llama3_8b_shapes_capped_at_128_registers_are_bitwise_the_default(n, k):
    """Three and four tiles in flight with ptxas capping the threads at 128 registers (spilling what is left):
    the same sums in the same order as the default launch, bit for bit."""
    packed, sz, _ = _int4(n, k, seed=n % 89)
    x = _rand(1, k, seed=6, dtype=torch.bfloat16)
    base = triton_gemv_w4m.default_config(n, k)
    want = gemv(x, packed, scales_zeros=sz, group_size=32, cfg=base)
    for pf in (3, 4):
        got = gemv(x, packed, scales_zeros=sz, group_size=32, cfg=replace(base, prefetch=pf, maxnreg=128))
        assert torch.equal(got, want), pf


@cuda_only
@pytest.mark.parametrize("n,k", LLAMA3_8B_SHAPES[:4])
def test_llama3_8b_shapes_with_l2_and_cache_hints_are_bitwise_the_default(n, k):
    """Tiles asked of the L2 (hints only) one or three steps beyond the register prefetch, or before the PDL wait
    (also ahead of the cp.async stages), and the weight loads' cache hints (`.cg`, evict-first): the bits of the
    same launch without them."""
    packed, sz, _ = _int4(n, k, seed=n % 83)
    x = _rand(1, k, seed=7, dtype=torch.bfloat16)
    base = triton_gemv_w4m.default_config(n, k)
    for plain, hints in ((base, {"l2_ahead": 1}), (base, {"l2_ahead": 3}), (base, {"l2_first": 2}),
                         (replace(base, stages=3), {"l2_first": 2}),
                         *((replace(base, weight_cache=0), {"weight_cache": wc}) for wc in (1, 2))):
        want = gemv(x, packed, scales_zeros=sz, group_size=32, cfg=plain)
        got = gemv(x, packed, scales_zeros=sz, group_size=32, cfg=replace(plain, **hints))
        assert torch.equal(got, want), (plain, hints)


@cuda_only
def test_persistent_grid_replays_in_a_cuda_graph():
    from tests.layers.test_triton_gemv_int4 import replays_in_a_cuda_graph

    packed, sz, _ = _int4(6144, 4096, seed=10)
    replays_in_a_cuda_graph(packed, sz, cfg=replace(triton_gemv_w4m.default_config(6144, 4096), persistent=4))


@cuda_only
def test_an_input_off_a_16_byte_boundary_is_copied():
    """A view starting 2 bytes past a 16-byte boundary would compile to unvectorized loads (another lane
    layout): `launch` copies it, and the product equals the aligned input's bitwise."""
    packed, sz, _ = _int4(256, 512, seed=31)
    buf = _rand(1, 513, seed=32, dtype=torch.bfloat16)
    x = buf[:, 1:]
    assert x.data_ptr() % 16 != 0
    got = gemv(x, packed, scales_zeros=sz, group_size=32)
    assert torch.equal(got, gemv(x.contiguous().clone(), packed, scales_zeros=sz, group_size=32))


# compiled for sm_90 offline (no GPU): a kernel's TTGIR and its blocked layouts by name, with what the launcher
# specializes for torch's allocations (16-byte aligned pointers, sizes divisible by 16)
_PROBE_COMPILE = r"""
import json, re
import triton
from triton.compiler import ASTSource
from triton.backends.compiler import GPUTarget


def ttgir(fn, consts, ptrs, sig_over=None):
    names = fn.arg_names
    sig = {a: "constexpr" if a in consts else ptrs.get(a, "*bf16") if a.endswith("_ptr")
           else "fp32" if a in ("eps", "norm_k") else "i32" for a in names}
    sig.update(sig_over or {})
    attrs = {(names.index(a),): [["tt.divisibility", 16]] for a in names
             if sig[a].startswith("*") or a in ("N", "K", "NT")}
    c = triton.compile(ASTSource(fn, sig, consts, attrs), target=GPUTarget("cuda", 90, 32),
                       options={"num_warps": 4, "num_stages": 1})
    g = c.asm["ttgir"]
    return g, dict(re.findall(r"^(#\w+) = (#ttg\.blocked<.*>)$", g, re.M))
"""

_LAYOUT_PROBE = _PROBE_COMPILE + r"""
from augury.layers.triton_gemv_w4m import _w4_mma_kernel as fn

ptrs = {"x_ptr": "*bf16", "g_ptr": "*bf16", "w_ptr": "*i32", "sz_ptr": "*i32", "ws_ptr": "*fp32", "cnt_ptr": "*i32",
        "xs_ptr": "*bf16", "slot_ptr": "*i64"}
out = {}
for pro in (0, 1, 2, 3):
    consts = dict(PRO=pro, RESIDUAL=True, ROPE_KV=False, HALF=1, PP=1, NB=128, W=4, PDL=True, ASM=True, NSPLIT=16,
                  NORM_BLOCK=4096, EVEN=True, LATE_LAUNCH=False, PF=1, LOADS_ONLY=False, STAGES=1, K_MAJOR=True,
                  MS=9 if pro == 3 else 1, MSP=16 if pro == 3 else 1, MD=128 if pro == 3 else 1,
                  L2A=0, L2F=0, WC=2, OPS=False)
    g, lay = ttgir(fn, consts, ptrs, {"x_ptr": "*fp32", "g_ptr": "*fp32"} if pro == 3 else None)
    out[pro] = [lay.get(m, m) for m in re.findall(r"tt\.load .*: tensor<128x8x!tt\.ptr<bf16>, (#\w+)>", g)]
print(json.dumps(out))
"""


def _compiled_offline(probe: str):
    """Run a probe that compiles for sm_90 on this machine (no GPU) in a process of its own (no interpreter);
    -> the JSON of its last line. Skips where no offline sm_90 compile is available."""
    import json
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=600)
    if run.returncode != 0:
        if "ptxas" in run.stderr or "cuda" in run.stderr.lower() and "backend" in run.stderr.lower():
            pytest.skip(f"no offline sm_90 compile here: {run.stderr.strip().splitlines()[-1]}")
        raise AssertionError(run.stderr[-3000:])
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_lane_operands_get_one_row_per_thread_compiled():
    """Compiled for sm_90 on this machine (offline, no GPU): the tensor-core GEMV's [128, 8] input loads, for
    every prologue, are 16-byte vectors with thread i holding row i (sizePerThread [1, 8], 32 threads down
    the rows), the layout its warp shuffles and mma take. The interpreter cannot see layouts; the twenty-third
    session's gathered merge input had 8 threads a row and came out 5.6% off on the H200."""
    layouts = _compiled_offline(_LAYOUT_PROBE)
    want = ("sizePerThread = [1, 8], threadsPerWarp = [32, 1], warpsPerCTA = [4, 1]")
    for pro, found in layouts.items():
        assert len(found) == (8 if pro in ("1", "2") else 4), (pro, found)  # x (and the norm weight, or up) at 4 steps
        assert all(want in f for f in found), (pro, found)


_STREAM_PROBE = _PROBE_COMPILE + r"""
from augury.layers.triton_gemv_w4m_stream import _w4_mma_stream_kernel as fn

ptrs = {"w_ptr": "*i32", "sz_ptr": "*i32", "ws_ptr": "*fp32", "cnt_ptr": "*i32", "slot_ptr": "*i64"}
out = {}
for pro, pf in ((1, 2), (2, 2), (2, 4), (0, 1)):
    consts = dict(PRO=pro, RESIDUAL=pro != 1, ROPE_KV=False, HALF=1, PP=1, NB=512, W=4, PDL=True, ASM=True, NSPLIT=16,
                  NORM_BLOCK=4096, PIECES=2, PF=pf, LOADS_ONLY=False, WC=2)
    g, lay = ttgir(fn, consts, ptrs)
    out[f"{pro}/{pf}"] = {
        "tiles": [lay.get(m, m) for m in re.findall(r"tt\.load .*: tensor<128x4x!tt\.ptr<i32>, (#\w+)>", g)],
        "inputs": [lay.get(m, m) for m in re.findall(r"tt\.load .*: tensor<128x8x!tt\.ptr<bf16>, (#\w+)>", g)],
        "moved_pointers": len(re.findall(r"ttg\.convert_layout .*: tensor<\d+x\d+x!tt\.ptr", g))}
print(json.dumps(out))
"""


def test_persistent_kernel_keeps_its_loads_16_byte_vectors_compiled():
    """Compiled for sm_90 offline: the persistent kernel's tile loads (in its loop, and the PF issued before the
    wait) and its input loads stay 16-byte vectors with thread i holding row i, and no pointer tensor is moved
    between layouts. Its first form (a loop over K slices around one over steps) carried the tile pointers in
    Triton's default layout and moved them through shared memory before every load: 5 stores and barriers a tile."""
    found = _compiled_offline(_STREAM_PROBE)
    rows = "threadsPerWarp = [32, 1], warpsPerCTA = [4, 1]"
    for key, f in found.items():
        pf = int(key.split("/")[1])
        assert len(f["tiles"]) == 5 * (pf + 1), (key, f)  # the PF before the wait, one tile in the loop
        assert all("sizePerThread = [1, 4], " + rows in t for t in f["tiles"]), (key, f)
        assert f["inputs"] and all("sizePerThread = [1, 8], " + rows in t for t in f["inputs"]), (key, f)
        assert f["moved_pointers"] == 0, (key, f)


@pytest.mark.skipif(FRESH, reason="this process runs the checks itself")
def test_in_fresh_process():
    rerun_in_fresh_process(__file__, timeout=900)
