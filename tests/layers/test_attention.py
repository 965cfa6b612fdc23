"""Paged attention: metadata semantics (slots, causal + sliding masks, released blocks)
and the batched op against a per-request dense reference."""

import math
import random

import pytest
import torch

from augury.layers.attention import (
    AttentionMetadataError,
    SeqSpec,
    build_attention_metadata,
    paged_attention,
)

BS = 4


class SimplePool:
    def __init__(self, num_blocks, hkv, d, dtype=torch.float32):
        self.k = torch.full((num_blocks * BS, hkv, d), float("nan"), dtype=dtype)
        self.v = torch.full((num_blocks * BS, hkv, d), float("nan"), dtype=dtype)


def make_specs(lens, window=None, seed=0, num_blocks=64):
    """lens: [(num_cached, num_new)] -> specs with shuffled tables, sliding blocks released."""
    rng = random.Random(seed)
    free = list(range(num_blocks))
    rng.shuffle(free)
    specs = []
    for nc, nn in lens:
        nb = -(-(nc + nn) // BS)
        full = [free.pop() for _ in range(nb)]
        tables = {"full": full}
        if window is not None:
            lo = max(0, nc - window + 1) // BS
            tables["sliding"] = [-1] * lo + [free.pop() for _ in range(nb - lo)]
        specs.append(SeqSpec(num_cached=nc, num_new=nn, block_tables=tables))
    return specs


def slot(table, p):
    return table[p // BS] * BS + p % BS


def expected_keys(nc, nn, j, window):
    q = nc + j
    return [p for p in range(nc + nn) if p <= q and (window is None or p > q - window)]


LENS = [(0, 5), (9, 1), (3, 6), (13, 1), (21, 3)]


@pytest.mark.parametrize("window", [None, 6, 3])
def test_metadata_slots_and_mask_semantics(window):
    specs = make_specs(LENS, window)
    windows = {"full": None} if window is None else {"full": None, "sliding": window}
    meta = build_attention_metadata(specs, BS, windows, "cpu")
    assert meta.num_tokens == sum(nn for _, nn in LENS) and meta.max_q == 6 and not meta.uniform
    assert meta.query_start == [0, 5, 6, 12, 13, 16]
    want_pos = [nc + j for nc, nn in LENS for j in range(nn)]
    assert meta.positions.tolist() == want_pos
    for g, gm in meta.groups.items():
        w = windows[g]
        assert gm.window == w
        want_slots = [slot(s.block_tables[g], nc + j) for s, (nc, nn) in zip(specs, LENS) for j in range(nn)]
        assert gm.slot_mapping.tolist() == want_slots
        assert gm.mask.shape == (len(LENS), 1, meta.max_q, gm.max_kv)
        for b, (s, (nc, nn)) in enumerate(zip(specs, LENS)):
            for j in range(meta.max_q):
                row = gm.mask[b, 0, j]
                assert row.any(), "no query row may be fully masked"
                if j >= nn:
                    continue
                attended = gm.gather_slots[b][row].tolist()
                want = [slot(s.block_tables[g], p) for p in expected_keys(nc, nn, j, w)]
                assert sorted(attended) == sorted(want), (g, b, j)
            # nothing read from a released block
            assert (gm.gather_slots[b] >= 0).all()


def test_uniform_decode_has_no_scatter():
    meta = build_attention_metadata(make_specs([(5, 1), (0, 1), (17, 1)]), BS, {"full": None}, "cpu")
    assert meta.uniform and meta.max_q == 1
    assert meta.groups["full"].q_index is None and meta.groups["full"].out_index is None


@pytest.mark.parametrize("window", [None, 3, 6])
def test_decode_steps_take_the_short_builder_with_the_same_metadata(window):
    """A step of single-token decodes is built by `_build_decodes`: field for field what the general
    builder makes (slots, gather, mask, positions, flags), windows and ragged lengths included."""
    from dataclasses import fields

    import augury.layers.attention as A

    rng = random.Random(3 if window is None else window)
    windows = {"full": None} if window is None else {"full": None, "sliding": window}
    for _ in range(20):
        specs = make_specs([(rng.randrange(0, 40), 1) for _ in range(rng.randrange(1, 5))], window=window,
                           seed=rng.randrange(100), num_blocks=128)
        short = A.build_attention_metadata(specs, BS, windows, "cpu")
        general = A._build(specs, BS, windows, "cpu")
        assert (short.num_tokens, short.num_seqs, short.max_q, short.uniform, short.query_start) == \
            (general.num_tokens, general.num_seqs, general.max_q, general.uniform, general.query_start)
        assert torch.equal(short.positions, general.positions)
        assert short.groups.keys() == general.groups.keys()
        for g in general.groups:
            a, b = short.groups[g], general.groups[g]
            for f in fields(b):
                x, y = getattr(a, f.name), getattr(b, f.name)
                assert torch.equal(x, y) if isinstance(y, torch.Tensor) else x == y, (g, f.name)


def test_decode_steps_report_the_general_builders_error_first():
    """Two faults in one step (a released block read by request 0, a short table in request 1, one group): the
    short builder names the same one `_build` does."""
    import augury.layers.attention as A

    specs = make_specs([(10, 1), (9, 1)], num_blocks=128)
    specs[0].block_tables["full"][1] = -1
    specs[1].block_tables["full"].pop()
    windows = {"full": None}
    with pytest.raises(AttentionMetadataError) as general:
        A._build(specs, BS, windows, "cpu")
    with pytest.raises(AttentionMetadataError) as short:
        A.build_attention_metadata(specs, BS, windows, "cpu")
    assert str(short.value) == str(general.value)


def test_released_block_in_window_is_an_error():
    specs = make_specs([(10, 1)], window=4)
    specs[0].block_tables["sliding"][2] = -1  # position 10 lives in block 2
    with pytest.raises(AttentionMetadataError, match="released"):
        build_attention_metadata(specs, BS, {"full": None, "sliding": 4}, "cpu")


def test_short_block_table_is_an_error():
    specs = make_specs([(7, 2)])
    specs[0].block_tables["full"].pop()
    with pytest.raises(AttentionMetadataError, match="blocks"):
        build_attention_metadata(specs, BS, {"full": None}, "cpu")


def test_sliding_group_needs_a_window():
    with pytest.raises(AttentionMetadataError, match="window"):
        build_attention_metadata(make_specs([(3, 1)], window=4), BS, {"full": None}, "cpu")


def reference(q_new, k_hist, v_hist, nc, window, scale, softcap):
    """One request: q_new [n, H, D], k/v_hist [nc+n, Hkv, D] -> [n, H, D], dense and explicit."""
    n, H, D = q_new.shape
    rep = H // k_hist.shape[1]
    k = k_hist.repeat_interleave(rep, dim=1).double()
    v = v_hist.repeat_interleave(rep, dim=1).double()
    out = torch.empty(n, H, D, dtype=torch.float64)
    for j in range(n):
        keys = expected_keys(nc, n, j, window)
        s = torch.einsum("hd,khd->hk", q_new[j].double(), k[keys]) * scale
        if softcap is not None:
            s = torch.tanh(s / softcap) * softcap
        out[j] = torch.einsum("hk,khd->hd", s.softmax(-1), v[keys])
    return out


@pytest.mark.parametrize(
    "lens,window,softcap",
    [
        (LENS, None, None),
        (LENS, 5, None),
        (LENS, None, 2.0),
        (LENS, 5, 2.0),
        ([(4, 1), (0, 1), (11, 1)], None, None),  # uniform decode
        ([(4, 3), (0, 3), (11, 3)], 4, None),  # uniform verify windows
        ([(4, 1), (9, 1), (0, 6), (3, 2)], None, None),  # decodes first: two segments
        ([(12, 1), (2, 1), (5, 4), (0, 7)], 5, None),  # two segments, sliding
        ([(13, 1)], None, None),  # one decode reading every key: the mask is skipped
        ([(13, 1)], 5, None),  # one sliding decode: block-aligned start leaves masked keys
        ([(12, 1), (2, 1), (7, 1)], 5, None),  # uniform sliding decode, padded keys
        ([(12, 1), (2, 1)], None, 2.0),  # decode with softcap takes the eager softcap path
    ],
)
def test_paged_attention_matches_dense_reference(lens, window, softcap):
    torch.manual_seed(0)
    H, Hkv, D = 4, 2, 8
    scale = 1 / math.sqrt(D)
    group = "full" if window is None else "sliding"
    specs = make_specs(lens, window=window, seed=1)
    if window is not None:  # read through the sliding table only
        for s in specs:
            s.block_tables = {"sliding": s.block_tables["sliding"]}
    pool = SimplePool(64, Hkv, D)
    hist_k, hist_v, q_new, k_new, v_new = [], [], [], [], []
    for s, (nc, nn) in zip(specs, lens):
        k_all, v_all = torch.randn(nc + nn, Hkv, D), torch.randn(nc + nn, Hkv, D)
        hist_k.append(k_all)
        hist_v.append(v_all)
        table = s.block_tables[group]
        for p in range(nc):  # cached history (released blocks stay NaN)
            if table[p // BS] >= 0:
                pool.k[slot(table, p)] = k_all[p]
                pool.v[slot(table, p)] = v_all[p]
        q_new.append(torch.randn(nn, H, D))
        k_new.append(k_all[nc:])
        v_new.append(v_all[nc:])
    meta = build_attention_metadata(specs, BS, {group: window}, "cpu")
    n_dec = next((i for i, (_, nn) in enumerate(lens) if nn != 1), len(lens))
    assert (meta.groups[group].parts is not None) == (0 < n_dec < len(lens))
    out = paged_attention(
        torch.cat(q_new), torch.cat(k_new), torch.cat(v_new), pool.k, pool.v,
        meta.groups[group], scale, softcap,
    )
    assert out.shape == (meta.num_tokens, H, D)
    qs = meta.query_start
    for i, (nc, nn) in enumerate(lens):
        want = reference(q_new[i], hist_k[i], hist_v[i], nc, window, scale, softcap)
        torch.testing.assert_close(out[qs[i] : qs[i + 1]].double(), want, atol=1e-5, rtol=1e-5)
    # new K/V landed in their slots
    torch.testing.assert_close(pool.k[meta.groups[group].slot_mapping], torch.cat(k_new))


def test_dense_flag_only_when_every_key_is_visible():
    full = build_attention_metadata(make_specs([(13, 1)]), BS, {"full": None}, "cpu").groups["full"]
    assert full.dense and full.mask.all()
    two = build_attention_metadata(make_specs([(13, 1), (2, 1)]), BS, {"full": None}, "cpu").groups["full"]
    assert not two.dense
    specs = make_specs([(13, 1)], window=5)
    specs[0].block_tables = {"sliding": specs[0].block_tables["sliding"]}
    slid = build_attention_metadata(specs, BS, {"sliding": 5}, "cpu").groups["sliding"]
    assert not slid.dense and not slid.mask.all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_path_agrees_with_sdpa(dtype):
    """The CPU one-query path against SDPA on the same gathered keys (GQA, padding mask)."""
    import torch.nn.functional as F

    from augury.layers.attention_decode_cpu import attend_decode_cpu

    torch.manual_seed(0)
    H, Hkv, D = 6, 2, 16
    lens = [(9, 1), (3, 1), (17, 1)]
    meta = build_attention_metadata(make_specs(lens), BS, {"full": None}, "cpu")
    gm = meta.groups["full"]
    pool = SimplePool(64, Hkv, D, dtype)
    pool.k.normal_()
    pool.v.normal_()
    q = torch.randn(len(lens), H, D, dtype=dtype)
    got = attend_decode_cpu(q, lambda s: pool.k.index_select(0, s), lambda s: pool.v.index_select(0, s), gm, 0.25)
    B, K = gm.gather_slots.shape
    kc = pool.k[gm.gather_slots.view(-1)].view(B, K, Hkv, D).transpose(1, 2)
    vc = pool.v[gm.gather_slots.view(-1)].view(B, K, Hkv, D).transpose(1, 2)
    want = F.scaled_dot_product_attention(q.view(B, H, 1, D).float(), kc.float(), vc.float(), attn_mask=gm.mask,
                                          scale=0.25, enable_gqa=True).view(B, H, D)
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(got.float(), want, atol=tol, rtol=tol)


@pytest.mark.parametrize("heads", [(4, 2), (2, 2)])
def test_sdpa_segment_compiles_dynamic_without_graph_breaks(heads):
    """Prefill-wide segments under torch.compile(dynamic=True): one graph, no break on SDPA's
    enable_gqa (symbolic head counts), same output as eager — with and without GQA."""
    from torch._dynamo.utils import counters

    from augury.layers.attention import _attend_segment

    H, Hkv = heads
    D, bs = 16, 16
    g = torch.Generator().manual_seed(0)
    pool_k, pool_v = torch.randn(8 * bs, Hkv, D, generator=g), torch.randn(8 * bs, Hkv, D, generator=g)

    def seg(q, gm):
        return _attend_segment(q, lambda s: pool_k.index_select(0, s), lambda s: pool_v.index_select(0, s),
                               gm, 0.25, None)

    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(seg, dynamic=True, backend="eager")
    for T, ctx in [(20, 0), (24, 0), (30, 16)]:
        gm = build_attention_metadata([SeqSpec(ctx, T, {"full": list(range(8))})], bs, {"full": None},
                                      torch.device("cpu")).groups["full"]
        q = torch.randn(T, H, D, generator=g)
        torch.testing.assert_close(compiled(q, gm), seg(q, gm))
    assert dict(counters["graph_break"]) == {}
