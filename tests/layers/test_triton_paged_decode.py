"""The Triton paged decode-attention kernel over a native pool equals gather + attention.

Runs under TRITON_INTERPRET=1 on the CPU (kept small: the interpreter is slow); on a
CUDA machine (AUGURY_TEST_DEVICE=cuda or any visible GPU) the same checks run compiled."""

from __future__ import annotations


import pytest
import torch

from tests.triton_env import interpreter, rerun_in_fresh_process  # noqa: E402

CPU, FRESH = interpreter()

from augury.layers.attention import SeqSpec, build_attention_metadata, softcap_attention  # noqa: E402
from augury.layers.triton_paged_decode import paged_decode_attention, supported  # noqa: E402
from augury.layers.triton_splitkv import split_plan  # noqa: E402

here = pytest.mark.skipif(not FRESH, reason="triton was imported before the interpreter was on: test_in_fresh_process runs these")
cuda_only = pytest.mark.skipif(CPU, reason="needs a CUDA device")

DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")
BS = 8


def _case(lens, H=4, Hkv=2, D=64, window=None, seed=0, num_blocks=24, dtype=torch.float32):
    """Random pools (NaN in every slot nobody wrote) with shuffled block tables for `lens`."""
    g = torch.Generator().manual_seed(seed)
    n_slots = num_blocks * BS
    kp = torch.full((n_slots, Hkv, D), float("nan"))
    vp = torch.full((n_slots, Hkv, D), float("nan"))
    perm = torch.randperm(num_blocks, generator=g).tolist()
    specs = []
    for nc, nn in lens:
        nb = -(-(nc + nn) // BS)
        table = [perm.pop() for _ in range(nb)]
        specs.append(SeqSpec(nc, nn, {"full": table}))
        slots = torch.tensor([table[p // BS] * BS + p % BS for p in range(nc + nn)])
        kp[slots] = torch.randn(nc + nn, Hkv, D, generator=g) * 2
        vp[slots] = torch.randn(nc + nn, Hkv, D, generator=g)
    gm = build_attention_metadata(specs, BS, {"full": window}, DEV).groups["full"]
    q = torch.randn(gm.num_seqs, gm.max_q, H, D, generator=g)
    return q.to(DEV, dtype), kp.to(DEV, dtype), vp.to(DEV, dtype), gm


def _reference(q, kp, vp, gm, scale, softcap):
    """Gather every slot each request reads, then plain float32 attention -> [B, Q, H, D]."""
    B, Q, H, D = q.shape
    flat = gm.gather_slots.view(-1)
    k = kp.index_select(0, flat).view(B, -1, kp.shape[1], D).transpose(1, 2).float()
    v = vp.index_select(0, flat).view(B, -1, vp.shape[1], D).transpose(1, 2).float()
    o = softcap_attention(q.transpose(1, 2).float(), k, v, gm.mask, scale, 1e9 if softcap is None else softcap)
    return o.transpose(1, 2)


def _check(q, kp, vp, gm, scale=0.125, softcap=None, tol=2e-4, **kw):
    assert supported(q, kp, gm.max_q)
    out = paged_decode_attention(q, kp, vp, gm.gather_slots, gm.additive_mask(q.dtype), scale, softcap, **kw)
    ref = _reference(q, kp, vp, gm, scale, softcap)
    assert out.shape == ref.shape and out.dtype == q.dtype
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.float(), ref, atol=tol, rtol=tol)
    return out


@here
@pytest.mark.parametrize("splits", [1, 3])
def test_decode_and_verify_rows_with_padding(splits):
    # a decode (1 row), a verify window (4 rows) and a shorter one: padded to 4 rows, padded keys
    q, kp, vp, gm = _case([(37, 1), (20, 4), (9, 2)])
    _check(q, kp, vp, gm, num_splits=splits, block_n=16)


@here
def test_mqa_softcap_and_sliding_window():
    q, kp, vp, gm = _case([(30, 1), (13, 3)], H=4, Hkv=1, window=10, seed=1)
    _check(q, kp, vp, gm, scale=0.2, softcap=5.0, block_n=16)


@here
def test_splits_merge_to_the_same_result():
    q, kp, vp, gm = _case([(90, 1), (5, 1)], seed=2)
    one = _check(q, kp, vp, gm, num_splits=1, block_n=16)
    many = _check(q, kp, vp, gm, num_splits=5, block_n=16)
    torch.testing.assert_close(one, many, atol=1e-5, rtol=1e-5)


@here
def test_wide_verify_window_odd_head_dim_and_no_gqa():
    # 16 verify rows x 1 head per kv head; D = 40 exercises the masked head_dim lanes
    q, kp, vp, gm = _case([(25, 16), (3, 7)], H=2, Hkv=2, D=40, seed=3)
    _check(q, kp, vp, gm, block_n=16)


@here
def test_mask_is_read_not_rebuilt():
    # CUDA graphs refill the additive mask in place: the kernel must follow what it holds
    q, kp, vp, gm = _case([(20, 1), (20, 1)], seed=4)
    bias = gm.additive_mask(q.dtype).clone()
    bias[0, :, :, 5:] = float("-inf")  # request 0 now sees only its first 5 keys
    out = paged_decode_attention(q, kp, vp, gm.gather_slots, bias, 0.125, None, block_n=16)
    gm.mask[0, :, :, 5:] = False
    torch.testing.assert_close(out.float(), _reference(q, kp, vp, gm, 0.125, None), atol=2e-4, rtol=2e-4)


@here
def test_half_precision_pool_and_queries():
    # fp16 exercises the casts a bf16 model takes on the GPU (the interpreter's bf16 tl.dot is not exact)
    q, kp, vp, gm = _case([(37, 1), (20, 4)], seed=5, dtype=torch.float16)
    _check(q, kp, vp, gm, tol=3e-3, num_splits=2, block_n=16)


@here
def test_fp32_pool_read_by_half_queries():
    q, kp, vp, gm = _case([(21, 2)], seed=6)
    _check(q.half(), kp, vp, gm, tol=3e-3, block_n=16)


def test_supported_refuses_what_it_cannot_run():
    q = torch.zeros(2, 1, 4, 64, device=DEV)
    kp = torch.zeros(8, 2, 64, device=DEV)
    assert not supported(q, object(), 1)  # an encoded store: the codec kernel's job
    assert not supported(q, kp, max_q=64)  # 128 rows per program: a prefill, eager path
    assert not supported(q, torch.zeros(8, 3, 64, device=DEV), 1)  # H not a multiple of Hkv
    assert not supported(q, torch.zeros(8, 2, 32, device=DEV), 1)  # head dims differ


@cuda_only
def test_bf16_8b_shape_and_graph_capture():
    torch.manual_seed(0)
    B, H, Hkv, D, ctx, bs = 4, 32, 8, 128, 700, 16
    per = -(-(ctx + 1) // bs)
    specs = [SeqSpec(ctx - 13 * i, 1, {"full": list(range(i * per, (i + 1) * per))}) for i in range(B)]
    gm = build_attention_metadata(specs, bs, {"full": None}, DEV).groups["full"]
    kp = torch.randn(B * per * bs, Hkv, D, device=DEV, dtype=torch.bfloat16)
    vp = torch.randn_like(kp)
    q = torch.randn(B, 1, H, D, device=DEV, dtype=torch.bfloat16)
    bias = gm.additive_mask(torch.bfloat16)
    ref = _reference(q, kp, vp, gm, D ** -0.5, None)
    out = paged_decode_attention(q, kp, vp, gm.gather_slots, bias, D ** -0.5)
    torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=2e-2)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        got = paged_decode_attention(q, kp, vp, gm.gather_slots, bias, D ** -0.5)
    q.copy_(torch.randn_like(q))
    bias[1, :, :, 100:] = float("-inf")  # refill in place, as the runner does
    gm.mask[1, :, :, 100:] = False
    graph.replay()
    torch.testing.assert_close(got.float(), _reference(q, kp, vp, gm, D ** -0.5, None), atol=2e-2, rtol=2e-2)


@cuda_only
@pytest.mark.parametrize("launch", [{}, {"num_splits": 1}, {"one_launch": False}],
                         ids=["split-merged-in-kernel", "one-split", "merge-kernel"])
def test_programmatic_dependent_launch_modes_wait_for_the_kernel_before(launch, monkeypatch):
    """Every AUGURY_ATTN_PDL mode (`PDL_MODES`; `wait` by default), through the module setting and
    the call's `pdl_mode`, right after a PDL product that writes q and lets dependents start at
    once (`gemv(pdl=True)`), with a new q each time: the output equals the plain launch on the
    finished q bitwise (an attention that read q before the product ended would not)."""
    from augury.layers import triton_paged_decode
    from augury.layers.triton_gemv import gemv
    from augury.layers.triton_pdl import pdl_enabled

    if not pdl_enabled(DEV):
        pytest.skip("no programmatic dependent launch on this device")
    _, kp, vp, gm = _case([(300, 1)], H=32, Hkv=8, D=128, num_blocks=48, dtype=torch.bfloat16)
    bias = gm.additive_mask(torch.bfloat16)
    w = torch.randn(32 * 128, 2048, device=DEV, dtype=torch.bfloat16) * 0.05
    for i, mode in enumerate(list(triton_paged_decode.PDL_MODES.values()) * 2):
        by_call = i >= len(triton_paged_decode.PDL_MODES)
        monkeypatch.setattr(triton_paged_decode, "_PDL_MODE", 0 if by_call else mode)
        x = torch.randn(1, 2048, device=DEV, dtype=torch.bfloat16, generator=torch.Generator(DEV).manual_seed(i))
        q = gemv(x, w, pdl=True).view(1, 1, 32, 128)
        got = paged_decode_attention(q, kp, vp, gm.gather_slots, bias, 0.125, pdl_mode=mode if by_call else None,
                                     **launch)
        torch.cuda.synchronize()
        want = paged_decode_attention(q.clone(), kp, vp, gm.gather_slots, bias, 0.125, pdl_mode=0, **launch)
        assert torch.equal(got, want), f"mode {mode}"


def test_pdl_modes_parse_and_refuse_unknown_values():
    from augury.layers import triton_paged_decode as tpd

    assert tpd.PDL_MODES == {"0": 0, "1": 1, "late": 2, "wait": 3, "end": 4}
    assert tpd.pdl_mode_from(None) == 3 and tpd.pdl_mode_from("0") == 0 and tpd.pdl_mode_from("end") == 4
    with pytest.raises(ValueError, match="AUGURY_ATTN_PDL='off': use one of 0, 1, late, wait, end"):
        tpd.pdl_mode_from("off")


@cuda_only
def test_probe_stamps_leave_the_result_alone():
    """The latency probe (`times`): the output is bitwise the plain launch's; every program
    stamps its start and its K and V use in order, and the merging ones their arrival first."""
    q, kp, vp, gm = _case([(1000, 1)], H=32, Hkv=8, D=128, num_blocks=130, dtype=torch.bfloat16)
    bias = gm.additive_mask(q.dtype)
    t = torch.zeros(1024, 5, dtype=torch.int64, device=DEV)
    got = paged_decode_attention(q, kp, vp, gm.gather_slots, bias, 0.125, times=t)
    assert torch.equal(got, paged_decode_attention(q, kp, vp, gm.gather_slots, bias, 0.125))
    t = t[t[:, 0] > 0].cpu()
    assert t.shape[0] > 8  # several splits per KV head
    assert (t[:, 1] >= t[:, 0]).all() and (t[:, 2] >= t[:, 1]).all() and (t[:, 3] >= t[:, 2]).all()
    merged = t[t[:, 4] > 0]
    assert merged.shape[0] == 8 and (merged[:, 4] >= merged[:, 3]).all()  # one merge per KV head
    with pytest.raises(ValueError, match="times"):
        paged_decode_attention(q, kp, vp, gm.gather_slots, bias, 0.125, times=torch.zeros(4, dtype=torch.int64,
                                                                                           device=DEV))


@here
def test_attend_paged_matches_attend_on_mixed_steps():
    """The drop-in wiring (segments, padded rows, a prefill-wide segment left to SDPA) equals `attend`."""
    from augury.layers.attention import attend
    from augury.layers.triton_paged_decode import attend_paged

    def both(lens, seed, kernel_parts):
        q4, kp, vp, gm = _case(lens, seed=seed, num_blocks=40)
        assert gm.parts is not None and gm.q_index is not None
        assert [supported(q4, kp, part.max_q) for _, _, part in gm.parts] == kernel_parts
        T = sum(n for _, n in lens)
        q = torch.randn(T, q4.shape[2], q4.shape[3], generator=torch.Generator().manual_seed(seed + 1)).to(DEV)
        got = attend_paged(q, kp, vp, gm, 0.125, None)
        ref = attend(q, lambda s: kp.index_select(0, s), lambda s: vp.index_select(0, s), gm, 0.125, None)
        assert got.shape == (T, q.shape[1], q.shape[2])
        torch.testing.assert_close(got, ref, atol=2e-4, rtol=2e-4)

    # decodes, then verify windows of different widths (padded rows): both segments in the kernel
    both([(17, 1), (30, 1), (12, 2), (5, 4), (8, 3)], 7, [True, True])
    # a 40-token prefill chunk: 40 rows x 2 heads > MAX_QUERY_ROWS, that segment keeps gather + SDPA
    both([(3, 1), (0, 40), (6, 3)], 8, [True, False])
    # the decode-only step (one segment, no padding) too
    q4, kp, vp, gm = _case([(9, 1), (33, 1)], seed=9)
    q = q4.reshape(2, q4.shape[2], q4.shape[3])
    ref = attend(q, lambda s: kp.index_select(0, s), lambda s: vp.index_select(0, s), gm, 0.125, None)
    torch.testing.assert_close(attend_paged(q, kp, vp, gm, 0.125, None), ref, atol=2e-4, rtol=2e-4)


@here
def test_custom_op_schema_and_fake_match_the_kernel():
    # torch.compile sees the kernel only through augury::paged_decode_attention: its fake
    # (meta) result must have the real output's shape, dtype and strides
    from augury.layers.triton_paged_decode import paged_decode_op

    q, kp, vp, gm = _case([(37, 1), (20, 4)], seed=10)
    args = (q, kp, vp, gm.gather_slots, gm.additive_mask(q.dtype), 0.125, None)
    torch.library.opcheck(paged_decode_op, args,
                          test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_dynamic"))
    torch.testing.assert_close(paged_decode_op(*args).float(), _reference(q, kp, vp, gm, 0.125, None),
                               atol=2e-4, rtol=2e-4)


@here
def test_compiled_attend_paged_calls_the_kernel_as_one_op():
    """Under torch.compile (dynamic shapes, one graph) each kernel-width segment is one
    custom-op node, and the compiled step equals the eager one."""
    import torch._dynamo.testing as dynamo_testing

    from augury.layers.triton_paged_decode import attend_paged

    q4, kp, vp, gm = _case([(17, 1), (30, 1), (12, 2), (5, 4), (8, 3)], seed=11, num_blocks=40)
    T = 1 + 1 + 2 + 4 + 3
    q = torch.randn(T, q4.shape[2], q4.shape[3], generator=torch.Generator().manual_seed(12)).to(DEV)
    ref = attend_paged(q, kp, vp, gm, 0.125, None)
    torch._dynamo.reset()
    rec = dynamo_testing.AotEagerAndRecordGraphs()
    got = torch.compile(lambda q: attend_paged(q, kp, vp, gm, 0.125, None), backend=rec, fullgraph=True,
                        dynamic=True)(q)
    torch.testing.assert_close(got, ref, atol=2e-4, rtol=2e-4)
    ops = [n.target for g in rec.fw_graphs for n in g.graph.nodes if n.op == "call_function"]
    # two segments (the decodes unpadded, the verify windows padded to 4 rows), one kernel each
    assert ops.count(torch.ops.augury.paged_decode_attention.default) == 2
    torch._dynamo.reset()


@cuda_only
def test_compiled_paged_attention_writes_kv_and_calls_the_op():
    """The CUDA branch of `paged_attention` under torch.compile: K/V written into the pool
    first, then the kernel (one custom op) reads it; same result and pool as eager."""
    import torch._dynamo.testing as dynamo_testing

    from augury.layers.attention import paged_attention

    q4, kp, vp, gm = _case([(17, 1), (30, 1), (12, 2), (5, 4)], seed=13, num_blocks=40)
    kp, vp = kp.nan_to_num(), vp.nan_to_num()
    T, H, Hkv, D = 8, q4.shape[2], kp.shape[1], q4.shape[3]
    g = torch.Generator().manual_seed(14)
    q, k, v = (torch.randn(T, h, D, generator=g).to(DEV) for h in (H, Hkv, Hkv))
    kp2, vp2 = kp.clone(), vp.clone()
    ref = paged_attention(q, k, v, kp2, vp2, gm, 0.125, None)
    torch._dynamo.reset()
    rec = dynamo_testing.AotEagerAndRecordGraphs()
    got = torch.compile(paged_attention, backend=rec, fullgraph=True, dynamic=True)(q, k, v, kp, vp, gm, 0.125, None)
    torch.testing.assert_close(got, ref, atol=2e-4, rtol=2e-4)
    torch.testing.assert_close(kp, kp2)
    ops = [n.target for g in rec.fw_graphs for n in g.graph.nodes if n.op == "call_function"]
    assert ops.count(torch.ops.augury.paged_decode_attention.default) == 2
    torch._dynamo.reset()


# ---------------------------------------------------------------- merge in the same launch


def _counters():
    from augury.layers.triton_splitkv import split_counters

    return split_counters(DEV)


@here
@pytest.mark.parametrize("splits", [1, 2, 3, 5])
def test_one_launch_merge_equals_reference_and_two_launches(splits):
    # 80 keys in splits of whole 16-key tiles; request 1 is short: its later splits hold only
    # padded (masked) keys; request 2 is a 3-row verify window (padded query rows in the partials)
    q, kp, vp, gm = _case([(79, 1), (3, 1), (17, 3)], seed=20, num_blocks=30)
    assert split_plan(gm.max_kv, splits, 16)[0] == splits
    one = _check(q, kp, vp, gm, num_splits=splits, block_n=16)
    two = _check(q, kp, vp, gm, num_splits=splits, block_n=16, one_launch=False)
    torch.testing.assert_close(one, two, atol=1e-5, rtol=1e-5)
    assert not _counters().any()


@here
@pytest.mark.parametrize("prefetch", [False, True])
@pytest.mark.parametrize("num_warps", [1, 4])
def test_one_launch_merge_forms_and_prefetched_tiles(num_warps, prefetch):
    # 5 splits of 3 rows x 2 heads (8 merge rows) of D = 64: one warp's register budget holds 4
    # splits' accumulators, so the merge walks them in chunks (its loop); 4 warps hold all 8
    # (next power of 2) in one chunk (the straight-line merge, every load issued at once). With
    # prefetch each tile's slots and mask rows are loaded a tile ahead (request 1's later tiles
    # are masked padding, request 2's rows mask differently: a verify window)
    from augury.layers.triton_splitkv import merge_chunk

    assert (merge_chunk(5, 8, 64, num_warps) < 8) == (num_warps == 1)
    q, kp, vp, gm = _case([(79, 1), (3, 1), (17, 3)], seed=22, num_blocks=30)
    assert split_plan(gm.max_kv, 5, 16)[0] == 5
    one = _check(q, kp, vp, gm, num_splits=5, block_n=16, num_warps=num_warps, prefetch=prefetch)
    two = _check(q, kp, vp, gm, num_splits=5, block_n=16, num_warps=num_warps, prefetch=prefetch, one_launch=False)
    torch.testing.assert_close(one, two, atol=1e-5, rtol=1e-5)
    assert not _counters().any()


@here
@pytest.mark.parametrize("splits", [2, 3])
def test_one_launch_merge_sliding_window_softcap_gqa(splits):
    # a window of 37 over 80 keys (the first gathered keys masked) next to a short verify
    # window whose later splits see no key at all
    q, kp, vp, gm = _case([(79, 1), (9, 2)], H=8, Hkv=2, window=37, seed=21)
    assert not gm.mask[0, 0, 0, :3].any() and not gm.mask[1, 0, :, 16:].any()
    assert split_plan(gm.max_kv, splits, 16)[0] == splits
    _check(q, kp, vp, gm, scale=0.2, softcap=5.0, num_splits=splits, block_n=16)
    assert not _counters().any()


@here
def test_one_launch_is_bitwise_repeatable_and_leaves_the_counters_zero():
    # a captured graph replays the same launch: the counters must be back at 0 after each
    # call, and the merge order must not depend on which program arrived last
    q, kp, vp, gm = _case([(50, 1), (30, 1)], seed=22)
    bias = gm.additive_mask(q.dtype)
    a = paged_decode_attention(q, kp, vp, gm.gather_slots, bias, 0.125, None, num_splits=4, block_n=16)
    assert not _counters().any()
    b = paged_decode_attention(q, kp, vp, gm.gather_slots, bias, 0.125, None, num_splits=4, block_n=16)
    assert torch.equal(a, b)
    assert not _counters().any()


def test_split_counters_persist_grow_and_stay_alive():
    from augury.layers import triton_splitkv as sk

    dev = torch.device("cpu")
    first = sk.split_counters(dev, 4)
    assert first.dtype == torch.int32 and first.numel() >= sk.MIN_COUNTERS and not first.any()
    assert sk.split_counters(dev, 4) is first  # cached: graphs keep its address
    grown = sk.split_counters(dev, first.numel() + 1)
    assert grown.numel() > first.numel() and not grown.any()
    assert any(t is first for t in sk._RETIRED)  # an outgrown buffer is never freed
    assert sk.split_counters(dev, 1) is grown
    other = sk.split_counters(dev, 1, owner="argmax")  # another kernel's cells are its own
    assert other is not grown and not other.any()


def test_split_choice_is_pure_and_keeps_the_batch_64_grid():
    """The split choice is a pure function of shapes (H200: 132 SMs; decode rows of 4 heads
    per kv head pad to BLOCK_M = 16). Measured there (kernels_gpu --only attn-onelaunch), B = 1
    runs fastest with ~one wave of 128-key splits, single-tile splits allowed, not with the
    132-264 programs of shorter tiles (those were 5-20% slower)."""
    from augury.layers.triton_paged_decode import LaunchConfig, plan_launch

    sms, Hkv, rows, d = 132, 8, 16, 128
    # B = 1: 1k keys -> 9 single-tile splits (the two-launch choice: 4 splits of two tiles)
    cfg, S = plan_launch(rows, Hkv, 1024, d, sms)
    assert (cfg.block_n, cfg.num_warps, S) == (128, 4, 8) and cfg.min_tiles == 1
    assert cfg.l2_tiles == 1  # few programs, latency-bound: the first tile is asked of the L2 before the wait
    assert plan_launch(rows, Hkv, 1025, d, sms)[1] == 9  # a decode step at 1k context reads 1025 keys
    for max_kv in (4097, 8193):
        cfg, S = plan_launch(rows, Hkv, max_kv, d, sms)
        assert cfg.block_n == 128 and S == 17 and sms <= Hkv * S <= 2 * sms  # one wave
        assert plan_launch(rows, Hkv, max_kv, d, sms) == (cfg, S)  # same shapes, same grid
    # the two-launch choice is unchanged: 128-key tiles, at least 2 tiles a split
    assert plan_launch(rows, Hkv, 1024, d, sms, one_launch=False) == (LaunchConfig(128, 4, 3, 1.0, l2_tiles=1), 4)
    assert plan_launch(rows, 4 * Hkv, 4097, d, sms, one_launch=False) == (LaunchConfig(64, 4, 3, 2.0), 9)
    # B = 4: the same 9 splits of 64-key tiles, at 2 warps with the slots prefetched
    assert plan_launch(rows, 4 * Hkv, 4097, d, sms) == (LaunchConfig(64, 2, 3, 2.0, prefetch=True), 9)
    # B = 64: the swept grid (64-key tiles, 2 warps, no split) either way
    for max_kv in (1025, 8193):
        assert plan_launch(rows, 64 * Hkv, max_kv, d, sms) == (LaunchConfig(64, 2, 3, 2.0), 1)
        assert plan_launch(rows, 64 * Hkv, max_kv, d, sms, one_launch=False) == (LaunchConfig(64, 2, 3, 2.0), 1)


@cuda_only
@pytest.mark.parametrize("H,Hkv,max_q", [(32, 8, 1), (8, 8, 1), (32, 8, 16), (32, 8, 3)])
def test_one_launch_on_the_gpu_is_deterministic_and_matches(H, Hkv, max_q):
    """Compiled: the default split choice and forced many splits match the reference and
    the two-launch path; 50 repeated calls are bitwise equal (a memory-ordering slip in the
    last-program merge would show up as a stray difference); the counters end at 0."""
    torch.manual_seed(1)
    D, bs = 128, 16
    for B, ctx in ((1, 1000), (1, 4000), (3, 777)):
        per = -(-(ctx + max_q) // bs)
        specs = [SeqSpec(ctx - 37 * i, max_q, {"full": list(range(i * per, (i + 1) * per))}) for i in range(B)]
        gm = build_attention_metadata(specs, bs, {"full": None}, DEV).groups["full"]
        kp = torch.randn(B * per * bs, Hkv, D, device=DEV, dtype=torch.bfloat16)
        vp = torch.randn_like(kp)
        q = torch.randn(B, max_q, H, D, device=DEV, dtype=torch.bfloat16)
        bias = gm.additive_mask(torch.bfloat16)
        ref = _reference(q, kp, vp, gm, D ** -0.5, None)
        for kw in ({}, {"num_splits": 13, "block_n": 32}):
            if max_q * H // Hkv > 64:
                continue
            out = paged_decode_attention(q, kp, vp, gm.gather_slots, bias, D ** -0.5, **kw)
            torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=2e-2)
            two = paged_decode_attention(q, kp, vp, gm.gather_slots, bias, D ** -0.5, one_launch=False, **kw)
            torch.testing.assert_close(out.float(), two.float(), atol=2e-2, rtol=2e-2)
            for _ in range(50):
                assert torch.equal(paged_decode_attention(q, kp, vp, gm.gather_slots, bias, D ** -0.5, **kw), out)
            assert not _counters().any()


@cuda_only
def test_capture_without_counters_merges_with_a_second_kernel():
    """A graph captured before any counter buffer exists cannot create one (no zeroed memory
    inside a capture): that call takes the merge kernel and still replays correctly."""
    from augury.layers import triton_splitkv as sk

    dev = torch.device("cuda", torch.cuda.current_device())
    key = (dev, "attention")
    if key in sk._COUNTERS:
        sk._RETIRED.append(sk._COUNTERS.pop(key))
    torch.manual_seed(2)
    B, H, Hkv, D, ctx, bs = 1, 32, 8, 128, 1500, 16
    per = -(-(ctx + 1) // bs)
    gm = build_attention_metadata([SeqSpec(ctx, 1, {"full": list(range(per))})], bs, {"full": None}, DEV).groups["full"]
    kp = torch.randn(per * bs, Hkv, D, device=DEV, dtype=torch.bfloat16)
    vp = torch.randn_like(kp)
    q = torch.randn(B, 1, H, D, device=DEV, dtype=torch.bfloat16)
    bias = gm.additive_mask(torch.bfloat16)
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.cuda.graph(graph):
        got = paged_decode_attention(q, kp, vp, gm.gather_slots, bias, D ** -0.5, num_splits=6)
    assert key not in sk._COUNTERS  # nothing was allocated inside the capture
    graph.replay()
    torch.testing.assert_close(got.float(), _reference(q, kp, vp, gm, D ** -0.5, None), atol=2e-2, rtol=2e-2)


@cuda_only
def test_l2_prefetch_before_the_wait_changes_no_result():
    """The L2 hints (`l2_tiles`: the first key tiles before the PDL wait) right after the qkv product that
    writes this token's K/V row (`qkv_rope_kv`, PDL): every count equals the plain launch on the finished
    pools bitwise, eagerly and replayed in a CUDA graph, with padded keys repeating the written slot."""
    from dataclasses import replace

    from augury.layers.triton_gemv import qkv_rope_kv

    H, Hkv, D, pad = 32, 8, 128, 211
    _, kp, vp, gm = _case([(300, 1)], H=H, Hkv=Hkv, D=D, num_blocks=48, dtype=torch.bfloat16)
    gather = torch.cat([gm.gather_slots, gm.gather_slots[:, -1:].expand(-1, pad)], dim=1)
    mask = torch.cat([gm.mask, torch.zeros(*gm.mask.shape[:-1], pad, dtype=torch.bool, device=DEV)], -1)
    gm = replace(gm, gather_slots=gather, mask=mask, max_kv=gm.max_kv + pad, _bias={})
    bias = gm.additive_mask(torch.bfloat16)
    w = torch.randn((H + 2 * Hkv) * D, 4096, device=DEV, dtype=torch.bfloat16) * 0.02
    g = torch.rand(4096, device=DEV, dtype=torch.bfloat16) + 0.5
    cos, sin = torch.rand(D, device=DEV, dtype=torch.bfloat16), torch.rand(D, device=DEV, dtype=torch.bfloat16)
    x = torch.randn(1, 4096, device=DEV, dtype=torch.bfloat16)

    def step(**kw):
        q = qkv_rope_kv(x, w, norm_weight=g, eps=1e-5, cos=cos, sin=sin, k_pool=kp, v_pool=vp,
                        slot=gm.slot_mapping, num_heads=H, num_kv_heads=Hkv, pdl=True)
        return q, paged_decode_attention(q.view(1, 1, H, D), kp, vp, gm.gather_slots, bias, D ** -0.5, **kw)

    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()  # warm-up: compiles, and makes the counters outside the capture
        with torch.cuda.graph(graph):
            gq, gout = step()
    torch.cuda.current_stream().wait_stream(side)
    for i, kw in enumerate([{}, {"l2_tiles": 2}, {"num_splits": 3, "l2_tiles": 3}, None, None]):
        x.copy_(torch.randn(1, 4096, device=DEV, dtype=torch.bfloat16, generator=torch.Generator(DEV).manual_seed(i)))
        if kw is None:
            graph.replay()
            q, got = gq, gout
        else:
            q, got = step(**kw)
        torch.cuda.synchronize()
        want = paged_decode_attention(q.view(1, 1, H, D).clone(), kp, vp, gm.gather_slots, bias, D ** -0.5,
                                      pdl_mode=0, l2_tiles=0, **{k: v for k, v in (kw or {}).items() if k != "l2_tiles"})
        assert torch.equal(got, want), f"call {i}: {kw}"


@cuda_only
def test_warming_the_next_weight_changes_no_result():
    """`l2_warm` (attention asks the L2 for the next product's weight and scales, shared out among its
    programs, once its q is in): bitwise the plain launch, eagerly and replayed in a CUDA graph, for one and
    two tensors, tensors smaller than the grid's share and ones not a whole number of 128-byte lines."""
    H, Hkv, D = 32, 8, 128
    _, kp, vp, gm = _case([(700, 1)], H=H, Hkv=Hkv, D=D, num_blocks=96, dtype=torch.bfloat16)
    bias = gm.additive_mask(torch.bfloat16)
    q = torch.randn(1, 1, H, D, device=DEV, dtype=torch.bfloat16)
    w = torch.randint(-2**31, 2**31 - 1, (256, 4096, 16), device=DEV, dtype=torch.int32)
    sz = torch.randint(-2**31, 2**31 - 1, (16, 64, 128), device=DEV, dtype=torch.int32)
    odd = torch.randn(1000 * 37 + 3, device=DEV, dtype=torch.bfloat16)
    want = paged_decode_attention(q, kp, vp, gm.gather_slots, bias, D ** -0.5)
    for warm in [(w,), (w, sz), (odd,), (torch.zeros(5, device=DEV, dtype=torch.int32), sz)]:
        got = paged_decode_attention(q, kp, vp, gm.gather_slots, bias, D ** -0.5, l2_warm=warm)
        assert torch.equal(got, want), [t.shape for t in warm]
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.cuda.graph(graph):
        gout = paged_decode_attention(q, kp, vp, gm.gather_slots, bias, D ** -0.5, l2_warm=(w, sz))
    torch.cuda.current_stream().wait_stream(side)
    for i in range(2):
        q.copy_(torch.randn(1, 1, H, D, device=DEV, dtype=torch.bfloat16, generator=torch.Generator(DEV).manual_seed(i)))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(gout, paged_decode_attention(q, kp, vp, gm.gather_slots, bias, D ** -0.5)), i


def test_warming_takes_at_most_two_contiguous_tensors():
    """`l2_warm` is refused (before any launch) for three tensors or a strided one."""
    q, kp, vp, gm = _case([(40, 1)], H=4, Hkv=2, D=16, num_blocks=8)
    bias = gm.additive_mask(q.dtype)
    t = torch.zeros(64, 4, device=DEV)
    for warm in [(t, t, t), (t.t(),)]:
        with pytest.raises(ValueError, match="l2_warm"):
            paged_decode_attention(q, kp, vp, gm.gather_slots, bias, 0.25, l2_warm=warm)


@pytest.mark.skipif(FRESH, reason="this process runs the checks itself")
def test_in_fresh_process():
    rerun_in_fresh_process(__file__, timeout=900)
