"""The GPU microbenchmark's host-side pieces (no GPU needed): its argument checks and the
summary of attention's in-kernel timestamps."""

from __future__ import annotations

import pytest
import torch

from augury.bench import gemv_gpu

EPOCH_NS = 1_764_000_000_123_456_789  # %globaltimer counts ns since the epoch: float64 alone would round it


def _layer(t0: int, starts: list[int], k: int, v: int, arrive: int | None, merged: int | None) -> torch.Tensor:
    """Stamps (ns) of one layer: program p starts at t0 + starts[p]; its last tile's q.k is done
    k ns later, its p.v v after that, it arrives `arrive` after that (None: a launch without
    the in-kernel merge writes no arrival); the last program's merged output at t0 + merged."""
    t = torch.zeros(1024, 5, dtype=torch.int64)
    for p, s in enumerate(starts):
        for i, dt in enumerate((0, k, k + v) if arrive is None else (0, k, k + v, k + v + arrive)):
            t[p, i] = t0 + s + dt
    if merged is not None:
        t[len(starts) - 1, 4] = t0 + merged
    return t


def test_probe_summary_reads_medians_lasts_and_gaps_to_the_nanosecond():
    layers = [_layer(EPOCH_NS + 20_000 * i, [0, 100, 300], 2_050, 1_030, 470, 5_010) for i in range(3)]
    got = gemv_gpu._probe_summary(layers)
    assert got["programs"] == 3
    assert got["start_median_us"] == pytest.approx(0.1) and got["start_last_us"] == pytest.approx(0.3)
    assert got["k_tile_median_us"] == pytest.approx(2.15) and got["k_tile_last_us"] == pytest.approx(2.35)
    assert got["arrived_last_us"] == pytest.approx(3.85)
    assert got["merged_us"] == pytest.approx(5.01)
    assert got["gap_to_next_layer_us"] == pytest.approx(14.99)  # 20 us apart, each layer's stamps span 5.01 us


def test_probe_summary_of_a_launch_without_the_in_kernel_merge():
    """One split (or a second merge kernel): no arrival or merge stamps -> None, not garbage."""
    got = gemv_gpu._probe_summary([_layer(EPOCH_NS + 9_000 * i, [0, 40], 1_000, 200, None, None) for i in range(2)])
    assert got["arrived_median_us"] is None and got["arrived_last_us"] is None and got["merged_us"] is None
    assert got["v_tile_last_us"] == pytest.approx(1.24)
    assert got["gap_to_next_layer_us"] == pytest.approx(7.76)


@pytest.mark.parametrize("arg,word", [("attention_no_pdl,nope", "nope"), ("pdl,pdl", "once")])
def test_bad_variant_lists_are_refused(capsys, arg, word):
    with pytest.raises(SystemExit):
        gemv_gpu.main(["--layer-variants", arg])
    assert word in capsys.readouterr().err
    assert set(gemv_gpu.LAYER_VARIANTS) >= {"attention_no_pdl", "attention_waits", "pdl", "no_pdl"}


def test_layer_chain_rounds_and_launch_overrides(monkeypatch):
    """The layer chain times each variant once per round, in list order, keeps every round and their
    median, and hands a `cfg_*` variant's launch parameters to its product only (kernels stubbed:
    one 8B-shaped layer on the CPU)."""
    import augury.layers.triton_gemv as tg
    import augury.layers.triton_paged_decode as tpd

    seen, order = [], []
    monkeypatch.setattr(tg, "gemv", lambda x, w, **kw: seen.append((tuple(w.shape), kw["cfg"])) or
                        torch.zeros(1, w.shape[0], dtype=x.dtype))
    monkeypatch.setattr(tg, "qkv_rope_kv", lambda x, w, **kw: seen.append(("qkv", kw["cfg"])) or
                        torch.zeros(1, 4096, dtype=x.dtype))
    monkeypatch.setattr(tpd, "paged_decode_attention", lambda q, *a, **kw: order.append(kw["pdl_mode"]) or
                        torch.zeros(q.shape, dtype=q.dtype))
    times = iter([120.0, 110.0, 118.0, 111.0, 124.0, 110.0, 122.0, 113.0])
    monkeypatch.setattr(gemv_gpu, "time_calls", lambda fns, dev: [f() for f in fns] and next(times))
    row = gemv_gpu.bench_layer_chain(torch.device("cpu"), 4e12, layers=1, ctx=40, rounds=2,
                                     variants=["attention_waits", "cfg_o16x2048w8"])
    base, o16 = row["variants"]["attention_waits"], row["variants"]["cfg_o16x2048w8"]
    assert [r["with_attention_us"] for r in base["runs"]] == [120.0, 124.0]  # rounds interleave the variants
    assert base["with_attention_us"] == 122.0 and base["attention_in_chain_us"] == 12.0
    assert o16["with_attention_us"] == 120.0 and o16["without_attention_us"] == 112.0
    o_cfgs = {c for shape, c in seen if shape == (4096, 4096)}
    assert o_cfgs == {None, tg.GemvConfig(16, 2048, 8)}  # None: the product's default launch
    assert {c for shape, c in seen if shape != (4096, 4096)} == {None}
    assert order == [3] * 4  # attention at AUGURY_ATTN_PDL=wait in both variants, both rounds


def test_layer_chain_weights_in_each_layout():
    """The int4 layer chain hands the products what `Int4Linear` would: tinygemm's bytes with the
    transposed scales, or the row-layout GEMV's copy of the same nibbles and scales."""
    from augury.layers import int4_layout
    from augury.layers.triton_gemv_w4r import blocked_entries

    dev = torch.device("cpu")
    bf = gemv_gpu._chain_weight(32, 1024, dev, 3, None)
    assert bf["w"].shape == (32, 1024) and bf["w"].dtype == torch.bfloat16
    tg = gemv_gpu._chain_weight(32, 1024, dev, 3, "tinygemm")
    rows = gemv_gpu._chain_weight(32, 1024, dev, 3, "rows")
    assert tg["w"].dim() == 4 and tg["scales_zeros"].shape == (32, 32) and rows["group_size"] == 32
    e = blocked_entries(32, 1024, 32)
    w, sz = int4_layout.unblock_rows(rows["w"], rows["scales_zeros"], e)
    assert torch.equal(int4_layout.unpack_rows(w), int4_layout.unpack(tg["w"]))
    assert torch.equal(sz, tg["scales_zeros"])


def test_int4_layer_chain_swaps_one_products_layout(monkeypatch):
    """A list of int4 layout mixes times every variant once per mix, keyed variant@mix, and each
    product gets the weight in the layout its letter names (kernels stubbed: one 8B-shaped layer)."""
    import augury.layers.triton_gemv as tg
    import augury.layers.triton_paged_decode as tpd

    seen = []
    monkeypatch.setattr(tg, "gemv", lambda x, w, **kw: seen.append(("r" if w.dim() == 2 else "t", w.shape)) or
                        torch.zeros(1, 28672 if w.numel() * 8 == 28672 * 4096 else 4096, dtype=x.dtype))
    monkeypatch.setattr(tg, "qkv_rope_kv", lambda x, w, **kw: seen.append(("r" if w.dim() == 2 else "t", "qkv")) or
                        torch.zeros(1, 4096, dtype=x.dtype))
    monkeypatch.setattr(tpd, "paged_decode_attention", lambda q, *a, **kw: torch.zeros(q.shape, dtype=q.dtype))
    monkeypatch.setattr(gemv_gpu, "time_calls", lambda fns, dev: [f() for f in fns] and 100.0)
    monkeypatch.setattr(gemv_gpu, "_chain_weight", lambda N, K, dev, seed, int4: {
        "w": torch.zeros((N, K // 8) if int4 == "rows" else (N // 8, 1, 1, 1), dtype=torch.int32)})
    row = gemv_gpu.bench_layer_chain(torch.device("cpu"), 4e12, layers=1, ctx=40, variants=["attention_waits"],
                                     int4=["tinygemm", "rttt"])
    assert set(row["variants"]) == {"attention_waits@tttt", "attention_waits@rttt"}
    assert row["variants"]["attention_waits@rttt"]["int4_mix"] == "rttt"
    # per chain (with and without attention) four products: all t, then qkv on r
    letters = "".join(c for c, _ in seen)
    assert letters == "tttt" * 2 + "rttt" * 2


def test_int4_layer_chain_on_the_mma_layout_takes_its_variants_overrides(monkeypatch):
    """--int4-layout mma: every product gets the tensor-core GEMV's weight, and a w4m_ variant's fields
    reach each product's W4MmaConfig (kernels stubbed: one 8B-shaped layer)."""
    import augury.layers.triton_gemv as tg
    import augury.layers.triton_paged_decode as tpd
    from augury.layers.triton_gemv_w4m import W4MmaConfig

    seen = []

    def product(x, w, cfg=None, **kw):
        seen.append((w.dim(), cfg))
        return torch.zeros(1, 28672 if w.shape[1] * 16 == 28672 else 4096, dtype=x.dtype)

    monkeypatch.setattr(tg, "gemv", product)
    monkeypatch.setattr(tg, "qkv_rope_kv", product)
    monkeypatch.setattr(tpd, "paged_decode_attention", lambda q, *a, **kw: torch.zeros(q.shape, dtype=q.dtype))
    monkeypatch.setattr(gemv_gpu, "time_calls", lambda fns, dev: [f() for f in fns] and 100.0)
    monkeypatch.setattr(gemv_gpu, "_chain_weight", lambda N, K, dev, seed, int4: {
        "w": torch.zeros((K // 256, N // 16, 512), dtype=torch.int32)})
    row = gemv_gpu.bench_layer_chain(torch.device("cpu"), 4e12, layers=1, ctx=40, variants=["w4m_st3_all"],
                                     int4="mma")
    assert row["variants"]["w4m_st3_all"]["int4_mix"] == "mmmm"
    assert len(seen) == 8 and all(d == 3 and isinstance(c, W4MmaConfig) and c.stages == 3 for d, c in seen)


@pytest.mark.parametrize("spec", ["rrr", "rows,xrrr"])
def test_bad_int4_layouts_are_refused(capsys, spec):
    with pytest.raises(SystemExit):
        gemv_gpu.main(["--int4-layout", spec])
    assert "--int4-layout" in capsys.readouterr().err


def test_products_chain_hands_each_product_its_weight(monkeypatch):
    """The four-product chain (`bench_chain`) runs the fused products in layer order on each layer's
    own weights, with and without PDL, and cuBLAS beside them (kernels stubbed: one 8B-shaped layer)."""
    import augury.layers.triton_gemv as tg

    seen = []
    monkeypatch.setattr(tg, "gemv", lambda x, w, **kw: seen.append((tuple(w.shape), kw["pdl"])) or
                        torch.zeros(1, w.shape[0], dtype=x.dtype))
    monkeypatch.setattr(gemv_gpu, "time_calls", lambda fns, dev: [f() for f in fns] and 100.0)
    row = gemv_gpu.bench_chain(torch.device("cpu"), 4e12, layers=1)
    shapes = [gemv_gpu.SHAPES[n][:2] for n in ("qkv", "o_proj", "gate_up", "down")]
    assert seen == [(s, True) for s in shapes] + [(s, False) for s in shapes]
    assert row["fused_pdl_us_per_layer"] == 100.0 and row["layers"] == 1
