"""Attention's split partials merged in the next product (`paged_decode_partials` + `gemv(merge_ml=...)`)
equal attention's own merge followed by the product, on the split-K GEMV for plain weights
(`triton_gemv_split`) and the tensor-core int4 GEMV; the fused layer takes that path where it fits.

Runs under TRITON_INTERPRET=1 on the CPU (bitwise against the attention-merged path: the interpreter
runs both merges in the same order); on a CUDA machine the same checks run compiled (within two
roundings), plus the 8B shapes in a captured CUDA graph."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.triton_env import interpreter, rerun_in_fresh_process  # noqa: E402

CPU, FRESH = interpreter()

from augury.layers import fused_decode, triton_gemv_split  # noqa: E402
from augury.layers.triton_gemv import gemv  # noqa: E402
from augury.layers.triton_gemv_split import SplitConfig  # noqa: E402
from augury.layers.triton_paged_decode import (  # noqa: E402
    paged_decode_attention, paged_decode_partials, paged_decode_partials_op, partial_splits)
from tests.layers.test_triton_gemv import _close, _rand  # noqa: E402
from tests.layers.test_triton_paged_decode import _case, _reference  # noqa: E402

here = pytest.mark.skipif(not FRESH, reason="triton was imported before the interpreter was on: test_in_fresh_process runs these")
cuda_only = pytest.mark.skipif(CPU, reason="needs a CUDA device")
DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _same(got, want):
    """Bitwise under the interpreter (the same product kernel both ways: only the merges differ, and
    they run in the same order there); compiled, the merges may differ in fp32 order."""
    if CPU:
        assert torch.equal(got, want)
    else:
        _close(got, want, got.dtype)


def _attention(splits, dtype=torch.float32, H=8, Hkv=2, D=64, ctx=37, seed=3):
    """(finished attention output [1, H * D], its partials (acc, ml)) of one decode token."""
    q, kp, vp, gm = _case([(ctx, 1)], H=H, Hkv=Hkv, D=D, seed=seed, dtype=dtype)
    args = (q, kp, vp, gm.gather_slots, gm.additive_mask(q.dtype), 0.125)
    o = paged_decode_attention(*args, num_splits=splits, block_n=16)
    acc, ml = paged_decode_partials(*args, num_splits=splits, block_n=16)
    assert acc.shape == (ml.shape[1], H * D) and ml.shape == (2, acc.shape[0], H)
    assert acc.dtype == ml.dtype == torch.float32
    torch.testing.assert_close(o.float(), _reference(q, kp, vp, gm, 0.125, None).to(dtype).float(),
                               atol=2e-3, rtol=2e-3)
    return o.reshape(1, H * D), acc, ml


@here
@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_plain_product_merges_the_partials_as_attention_does(splits, dtype):
    o, acc, ml = _attention(splits, dtype)
    w, r = _rand(96, 512, seed=1, dtype=dtype, scale=0.05), _rand(1, 96, seed=2, dtype=dtype)
    got = gemv(acc, w, residual=r, merge_ml=ml)
    assert got.dtype == dtype and got.shape == (1, 96)
    _close(got, gemv(o, w, residual=r), dtype)  # the split-K sums in another order than the row kernel
    # the split-K GEMV on the finished output: the same bits as on the partials (only the merge differs)
    from augury.layers.triton_gemv_split import gemv_split

    y = torch.empty_like(got)
    gemv_split(o.contiguous(), w, y, residual=r, merge_ml=None, merge={"MD": 64})
    _same(got, y)
    # and without a residual (the output takes the weight's dtype)
    _close(gemv(acc, w, merge_ml=ml), F.linear(o.float(), w.float()), dtype)


@here
@pytest.mark.parametrize("cfg", [SplitConfig(), SplitConfig(rows_per_program=32, block_n=8, num_warps=2)])
def test_split_k_gemv_on_bf16_weights_with_ragged_rows(cfg):
    """bf16 weights (the 8B path), rows past N in the last chunk, several chunks and K slices."""
    o, acc, ml = _attention(3)
    w, r = _rand(200, 512, seed=4, dtype=torch.bfloat16, scale=0.05), _rand(1, 200, seed=5, dtype=torch.bfloat16)
    got = gemv(acc, w, residual=r, merge_ml=ml, cfg=cfg)
    ref = (F.linear(o.to(torch.bfloat16).float(), w.float()).to(torch.bfloat16).float() + r.float())
    _close(got, ref, torch.bfloat16)
    _same(got, gemv(acc, w, residual=r, merge_ml=ml, cfg=cfg))  # deterministic


@here
def test_tensor_core_int4_gemv_merges_the_partials():
    from tests.layers.test_triton_gemv_w4m import M, _int4

    o, acc, ml = _attention(3)
    packed, sz, _ = _int4(96, 512, seed=5)
    r = _rand(1, 96, seed=6, dtype=torch.bfloat16)
    for cfg in (M(32, 2), M(64, 1, prefetch=2, k_major=True)):
        got = gemv(acc, packed, scales_zeros=sz, group_size=32, residual=r, merge_ml=ml, cfg=cfg)
        _same(got, gemv(o.to(torch.bfloat16), packed, scales_zeros=sz, group_size=32, residual=r, cfg=cfg))


@here
def test_bad_merges_are_refused():
    _, acc, ml = _attention(3)
    w = _rand(96, 512, seed=1, scale=0.05)
    with pytest.raises(ValueError, match="one prologue"):
        gemv(acc, w, merge_ml=ml, silu_mul=True)
    with pytest.raises(ValueError, match="float32 partials"):
        gemv(acc.half(), w, merge_ml=ml)
    with pytest.raises(ValueError, match="float32 partials"):
        gemv(acc, w, merge_ml=ml[:, :1])
    with pytest.raises(ValueError, match="split-K GEMV takes"):
        gemv(acc[:, :320], _rand(96, 320, seed=1), merge_ml=ml[..., :5])  # K = 320: no whole 256-column slices
    with pytest.raises(ValueError, match="SplitConfig"):
        from augury.layers.triton_gemv import GemvConfig

        gemv(acc, w, merge_ml=ml, cfg=GemvConfig())
    with pytest.raises(ValueError, match="defer_merge is for one query token"):
        q, kp, vp, gm = _case([(20, 1), (9, 1)], H=8, Hkv=2, D=64)
        paged_decode_partials(q, kp, vp, gm.gather_slots, gm.additive_mask(q.dtype), 0.125)
    assert triton_gemv_split.supported(4096, 4096, 128) and not triton_gemv_split.supported(576, 576, 64)


@here
def test_partials_op_schema_fake_and_split_count():
    """torch.compile sees the deferred attention through augury::paged_decode_partials: its fake results
    must have the real ones' shapes, dtypes and strides (the split count from shapes alone)."""
    q, kp, vp, gm = _case([(37, 1)], H=8, Hkv=2, D=64, seed=4)
    args = (q, kp, vp, gm.gather_slots, gm.additive_mask(q.dtype), 0.125, None)
    torch.library.opcheck(paged_decode_partials_op, args,
                          test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_dynamic"))
    acc, ml = paged_decode_partials_op(*args)
    assert acc.shape[0] == ml.shape[1] == partial_splits(q.shape, kp, gm.gather_slots.shape[1])


@here
def test_fused_layer_defers_the_merge_where_o_proj_takes_it(monkeypatch):
    """A tiny Llama whose o_proj takes 256-column slices (hidden 256, 4 heads of 64): the fused one-token
    step with o_proj merging attention's partials equals the unfused modules, and equals the fused step
    with attention merging them (AUGURY_DEFER_MERGE=0); the deferred path is taken once a layer."""
    from tests.layers.test_triton_gemv import fused_layer_outputs

    monkeypatch.setattr(fused_decode, "_DEFER_MERGE", "1")
    calls = []
    real = fused_decode._partials
    monkeypatch.setattr(fused_decode, "_partials", lambda *a: calls.append(r := real(*a)) or r)
    outs = fused_layer_outputs(torch.float32, hidden=256)
    assert len(calls) == 2 and all(c is not None for c in calls)
    torch.testing.assert_close(outs[True], outs[False], atol=1e-4, rtol=1e-4)
    monkeypatch.setattr(fused_decode, "_DEFER_MERGE", "0")
    calls.clear()
    merged = fused_layer_outputs(torch.float32, hidden=256, forces=(True,))
    assert calls == [None, None]
    torch.testing.assert_close(outs[True], merged[True], atol=1e-5, rtol=1e-5)
    monkeypatch.setattr(fused_decode, "_DEFER_MERGE", "int4")  # plain weights keep attention's own merge
    calls.clear()
    fused_layer_outputs(torch.float32, hidden=256, forces=(True,))
    assert calls == [None, None]


@here
def test_compiled_step_defers_the_merge_through_the_ops(monkeypatch):
    """Under torch.compile (fullgraph) a deferred layer is augury::paged_decode_partials + augury::gemv with
    the partials, and the compiled step equals the eager one bitwise."""
    from tests.layers.test_triton_gemv import compiled_tiny_step

    monkeypatch.setattr(fused_decode, "_DEFER_MERGE", "1")
    seen, got, want = compiled_tiny_step(hidden=256)
    assert sum("augury.paged_decode_partials" in s for s in seen) == 2
    assert sum("augury.gemv" in s for s in seen) == 6
    torch.testing.assert_close(got, want, atol=0, rtol=0)


@cuda_only
def test_8b_shapes_in_a_cuda_graph():
    """At 8B shapes (32 heads x 128, 1,100 keys: 9 splits) the deferred merge equals attention's within two
    bf16 roundings, bf16 and int4 (mma), and a captured graph of attention + o_proj replays bitwise."""
    from augury.bench.gemv_gpu import _chain_weight
    from augury.bench.kernels_gpu import _attention_case

    H, Hkv, D = 32, 8, 128
    gm, n_slots = _attention_case(1, 1100, 1, H, Hkv, D, DEV, torch.bfloat16)
    bias = gm.additive_mask(torch.bfloat16)
    kp, vp = (torch.randn(n_slots, Hkv, D, device=DEV, dtype=torch.bfloat16) for _ in range(2))
    q = torch.randn(1, 1, H, D, device=DEV, dtype=torch.bfloat16)
    h = torch.randn(1, 4096, device=DEV, dtype=torch.bfloat16)
    o = paged_decode_attention(q, kp, vp, gm.gather_slots, bias, D ** -0.5).reshape(1, H * D)
    for layout in (None, "mma"):
        wt = _chain_weight(4096, 4096, DEV, 1, layout)
        want = gemv(o, **wt, residual=h)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            acc, ml = paged_decode_partials(q, kp, vp, gm.gather_slots, bias, D ** -0.5)
            y = gemv(acc, **wt, residual=h, merge_ml=ml)
        g.replay()
        first = y.clone()
        g.replay()
        assert acc.shape[0] == 9 and torch.equal(y, first)
        _close(y, want, torch.bfloat16)


@pytest.mark.skipif(FRESH, reason="this process runs the checks itself")
def test_in_fresh_process():
    rerun_in_fresh_process(__file__, timeout=900)
