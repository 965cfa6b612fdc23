"""The Gluon-staged int4 product (`gluon_gemv_w4m`, `W4MmaConfig.gluon`) against the Triton kernel.

On the CPU (TRITON_INTERPRET=1, where Gluon does not run) the operand buffer's contract is checked: the Triton
kernel fed by `_prep_kernel`'s operands (its `OPS` mode) is bitwise its own, with every prologue (none, norm,
SiLU-mul, attention's merge) and epilogue (residual, rope + K/V writes); a config asking for Gluon runs the Triton
kernel there; and the Gluon kernel compiles for sm_90 offline. On a CUDA machine the Gluon kernel itself is checked
against the Triton one on the 8B shapes with every prologue, twice (its counters reset), with attention's merge and
rope + K/V, and in a captured CUDA graph. It is not bitwise the Triton kernel: on an H100 (forty-fourth session) one
qkv output differed by one bf16 rounding step (4.9e-4; the per-tile fp32 math contracts into FMAs differently), so
these compare within one rounding step of each element (two after rope's rotation)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from tests.triton_env import interpreter, rerun_in_fresh_process  # noqa: E402

CPU, FRESH = interpreter()

from augury.layers import gluon_gemv_w4m, triton_gemv_w4m  # noqa: E402
from augury.layers.triton_gemv import gemv  # noqa: E402
from tests.layers.test_triton_gemv_int4 import _rand, cuda_only, here  # noqa: E402
from tests.layers.test_triton_gemv_w4m import M, _int4  # noqa: E402
from tests.layers.test_triton_gemv_w4r import LLAMA3_8B_SHAPES  # noqa: E402

from augury.bench.gemv_gpu import GLUON_BEST as GLUON  # noqa: E402  (rows, warps, stages) per product


def _prologues(n, k, packed, sz, cfg, seed=1):
    """The product with each prologue and epilogue: plain, norm + residual, SiLU-mul + residual."""
    x = _rand(1, k, seed=seed, dtype=torch.bfloat16, scale=2.0)
    g, r = _rand(k, seed=seed + 1, dtype=torch.bfloat16), _rand(1, n, seed=seed + 2, dtype=torch.bfloat16)
    gu = _rand(1, 2 * k, seed=seed + 3, dtype=torch.bfloat16)
    kw = {"scales_zeros": sz, "group_size": 32, "cfg": cfg}
    return (gemv(x, packed, **kw), gemv(x, packed, norm_weight=g, eps=1e-5, residual=r, **kw),
            gemv(gu, packed, silu_mul=True, residual=r, **kw))


@pytest.fixture
def through_prep(monkeypatch):
    """Call it to take every mma int4 product's operands from `gluon_gemv_w4m.prep` from then on (the Triton
    kernel's OPS mode)."""
    plain = triton_gemv_w4m.launch

    def launch(x, g, w, sz, r, y, n, k, eps, rope_args, **kw):
        ops = gluon_gemv_w4m.prep(x, g, y, k, eps, pro=kw["pro"], pdl=False, merge=kw.get("merge", (1, 1)))
        plain(x, g, w, sz, r, y, n, k, eps, rope_args, ops=ops, **kw)

    return lambda: monkeypatch.setattr(triton_gemv_w4m, "launch", launch)


@here
@pytest.mark.parametrize("n,k,cfg", [(64, 512, M(64, 1, prefetch=2)), (96, 768, M(32, 2, k_major=True))])
def test_prep_operands_give_the_kernels_own_bits(n, k, cfg, through_prep):
    packed, sz, _ = _int4(n, k, seed=n + k)
    want = _prologues(n, k, packed, sz, cfg)
    through_prep()
    for got, ref in zip(_prologues(n, k, packed, sz, cfg), want):
        assert torch.equal(got, ref)


@here
def test_prep_operands_merge_attention_and_feed_rope_kv(through_prep):
    from tests.layers.test_triton_gemv_int4 import qkv_rope_kv_against_its_parts
    from tests.layers.test_triton_gemv_split import _attention

    o, acc, ml = _attention(3)
    packed, sz, _ = _int4(96, 512, seed=5)
    r = _rand(1, 96, seed=6, dtype=torch.bfloat16)
    cfg = M(32, 2)
    kw = {"scales_zeros": sz, "group_size": 32, "residual": r, "cfg": cfg}
    want = gemv(acc, packed, merge_ml=ml, **kw)
    H, Hkv, D = 4, 2, 16
    qkv_w, qkv_sz, _ = _int4((H + 2 * Hkv) * D, 512, seed=7)
    rope = (qkv_w, qkv_sz, 32, H, Hkv, D, 512, torch.bfloat16, M(64, 1))
    q_want, _, k_want, _ = qkv_rope_kv_against_its_parts(*rope, seed=8)
    through_prep()
    assert torch.equal(gemv(acc, packed, merge_ml=ml, **kw), want)
    q, qk, k_pool, k_ref = qkv_rope_kv_against_its_parts(*rope, seed=8)
    assert torch.equal(q, q_want) and torch.equal(k_pool, k_want)


@here
def test_a_gluon_config_runs_the_triton_kernel_where_gluon_does_not_and_bad_stages_are_refused():
    packed, sz, _ = _int4(64, 512, seed=3)
    x = _rand(1, 512, seed=4, dtype=torch.bfloat16)
    kw = {"scales_zeros": sz, "group_size": 32}
    if CPU:
        assert torch.equal(gemv(x, packed, cfg=M(64, 1, gluon=4), **kw), gemv(x, packed, cfg=M(64, 1), **kw))
    assert not gluon_gemv_w4m.fits(80, 512, M(64, 1, gluon=4), False, 0)  # a ragged last chunk
    assert not gluon_gemv_w4m.fits(64, 512, M(64, 1, gluon=3), False, 0)
    with pytest.raises(ValueError, match="gluon stages"):
        gemv(x, packed, cfg=M(64, 1, gluon=3), **kw)


def _within_roundings(got, ref, steps=1):
    """Every element within `steps` bf16 rounding steps (at the larger magnitude's exponent) of the reference."""
    g, r = got.float(), ref.float()
    ulp = torch.exp2(torch.floor(torch.log2(torch.maximum(g.abs(), r.abs()).clamp_min(2.0 ** -126))) - 7)
    bad = (g - r).abs() > steps * ulp
    assert not bad.any(), (int(bad.sum()), (g - r).abs().max().item())


def _gluon_cfg(n, k):
    base = triton_gemv_w4m.default_config(n, k)
    cls = triton_gemv_w4m.product_class(n, k)
    nb, w, s = GLUON.get(cls, (base.rows_per_program, base.num_warps, 4))
    return base, replace(base, rows_per_program=nb, num_warps=w, gluon=s, k_major=True)


@cuda_only
@pytest.mark.skipif(not gluon_gemv_w4m.AVAILABLE, reason="this Triton has no Gluon")
@pytest.mark.parametrize("n,k", LLAMA3_8B_SHAPES)  # the layer products and the LM head
def test_llama3_8b_shapes_gluon_matches_the_triton_kernel(n, k):
    packed, sz, _ = _int4(n, k, seed=n % 79)
    base, cfg = _gluon_cfg(n, k)
    want = _prologues(n, k, packed, sz, base, seed=9)
    for call in range(2):  # the second call finds the counters the first one reset
        for got, ref in zip(_prologues(n, k, packed, sz, cfg, seed=9), want):
            _within_roundings(got, ref)


@cuda_only
@pytest.mark.skipif(not gluon_gemv_w4m.AVAILABLE, reason="this Triton has no Gluon")
def test_gluon_merges_attention_writes_rope_kv_and_replays_in_a_cuda_graph():
    from tests.layers.test_triton_gemv_int4 import qkv_rope_kv_against_its_parts, replays_in_a_cuda_graph
    from tests.layers.test_triton_gemv_split import _attention

    o, acc, ml = _attention(3, H=32, Hkv=8, D=128)
    packed, sz, _ = _int4(4096, 4096, seed=5)
    r = _rand(1, 4096, seed=6, dtype=torch.bfloat16)
    base, cfg = _gluon_cfg(4096, 4096)
    kw = {"scales_zeros": sz, "group_size": 32, "residual": r, "merge_ml": ml}
    _within_roundings(gemv(acc, packed, cfg=cfg, **kw), gemv(acc, packed, cfg=base, **kw))
    H, Hkv, D = 32, 8, 128
    packed, sz, _ = _int4((H + 2 * Hkv) * D, 4096, seed=7)
    base, cfg = _gluon_cfg((H + 2 * Hkv) * D, 4096)
    got = qkv_rope_kv_against_its_parts(packed, sz, 32, H, Hkv, D, 4096, torch.bfloat16, cfg, seed=8)
    want = qkv_rope_kv_against_its_parts(packed, sz, 32, H, Hkv, D, 4096, torch.bfloat16, base, seed=8)
    _within_roundings(got[0], want[0], steps=2)  # q
    _within_roundings(got[2], want[2], steps=2)  # the K pool with this token's rotated row
    replays_in_a_cuda_graph(packed, sz, cfg=cfg)  # a replay against the eager Gluon call: bitwise


_GLUON_PROBE = r"""
import json, re
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
from augury.layers import gluon_gemv_w4m as G

fn = G._g4m_kernel
names = fn.arg_names
ptrs = {"w_ptr": "*i32", "sz_ptr": "*i32", "op_ptr": "*i32", "r_ptr": "*bf16", "y_ptr": "*bf16", "ws_ptr": "*fp32",
        "cnt_ptr": "*i32", "cos_ptr": "*bf16", "sin_ptr": "*bf16", "kp_ptr": "*bf16", "vp_ptr": "*bf16",
        "slot_ptr": "*i64"}
out = {}
for nb, w, s, res, rope in ((896, 4, 8, False, False), (256, 1, 8, True, False), (128, 2, 4, False, True)):
    consts = dict(NB=nb, W=w, S=s, WC=2, PDL=True, RESIDUAL=res, ROPE_KV=rope, HALF=64, PP=64, NSPLIT=16)
    sig = {a: ptrs.get(a, "constexpr" if a in consts else "i32") for a in names}
    attrs = {(names.index(a),): [["tt.divisibility", 16]] for a in ptrs if a != "slot_ptr"}
    c = triton.compile(GluonASTSource(fn, sig, consts, attrs), target=GPUTarget("cuda", 90, 32),
                       options={"num_warps": w, "num_stages": 1})
    ptx = c.asm["ptx"]
    out[f"{nb}/{w}/{s}"] = {"cp_async": len(re.findall(r"cp\.async\.c[ag]\.shared\.global", ptx)),
                            "mma": ptx.count("mma.sync.aligned.m16n8k16")}
print(json.dumps(out))
"""


@pytest.mark.skipif(not gluon_gemv_w4m.AVAILABLE, reason="this Triton has no Gluon")
def test_gluon_kernel_compiles_for_sm90_offline_with_its_copies_and_mmas():
    """Compiled for sm_90 on this machine (no GPU), for each epilogue: the loop's tile is 5 cp.async copies a
    thread (each stage of the prologue and the loop issue them: 5 S copies in all) and 16 mmas."""
    from tests.layers.test_triton_gemv_w4m import _compiled_offline

    for key, f in _compiled_offline(_GLUON_PROBE).items():
        stages = int(key.split("/")[2])
        assert f["cp_async"] == 5 * stages and f["mma"] == 16, (key, f)


@pytest.mark.skipif(FRESH, reason="this process runs the checks itself")
def test_in_fresh_process():
    rerun_in_fresh_process(__file__, timeout=900)
