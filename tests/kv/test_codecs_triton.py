"""The fused Triton decode-attention kernel over encoded KV equals dequantize-then-attend.

Runs under TRITON_INTERPRET=1 on the CPU (kept small: the interpreter is slow);
on a CUDA machine the same checks run compiled."""

from __future__ import annotations

import types

import pytest
import torch

from tests.triton_env import interpreter, rerun_in_fresh_process  # noqa: E402

CPU, FRESH = interpreter()

from augury.kv.codecs import EncodedStore, parse_codec  # noqa: E402
from augury.kv.codecs.triton_attention import encoded_decode_attention, fused_supported  # noqa: E402
from augury.layers.attention import SeqSpec, build_attention_metadata, softcap_attention  # noqa: E402

here = pytest.mark.skipif(not FRESH, reason="triton was imported before the interpreter was on: test_in_fresh_process runs these")

DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")
BS = 8


def _reference(qp, k_store, v_store, gather, mask, scale, softcap):
    """Dequantize every gathered slot, then plain attention: qp [B, Q, H, D] -> [B, Q, H, D]."""
    B, Q, H, D = qp.shape
    kc = k_store.read(gather.view(-1)).view(B, -1, k_store.num_kv_heads, D).transpose(1, 2).float()
    vc = v_store.read(gather.view(-1)).view(B, -1, v_store.num_kv_heads, D).transpose(1, 2).float()
    q = qp.transpose(1, 2).float()
    if softcap is None:
        softcap = 1e9  # tanh(s / c) * c == s to float precision
    o = softcap_attention(q, kc, vc, mask, scale, softcap)
    return o.transpose(1, 2)


def _case(scheme, lens, H=4, Hkv=2, D=64, window=None, seed=0, num_blocks=24):
    """Random K/V written through the codec into a shuffled paged pool; metadata for `lens`."""
    g = torch.Generator().manual_seed(seed)
    codec = parse_codec(scheme, group_size=32 if scheme.startswith("affine") else None)
    codec.bind(D)
    slots_n = num_blocks * BS
    ks = EncodedStore(codec.key, slots_n, Hkv, D, torch.float32, DEV)
    vs = EncodedStore(codec.value, slots_n, Hkv, D, torch.float32, DEV)
    perm = torch.randperm(num_blocks, generator=g).tolist()
    specs = []
    for nc, nn in lens:
        nb = -(-(nc + nn) // BS)
        specs.append(SeqSpec(nc, nn, {"full": [perm.pop() for _ in range(nb)]}))
    meta = build_attention_metadata(specs, BS, {"full": window}, DEV)
    gm = meta.groups["full"]
    for s in specs:
        n = s.num_cached + s.num_new
        slots = torch.tensor([s.block_tables["full"][p // BS] * BS + p % BS for p in range(n)], device=DEV)
        k = torch.randn(n, Hkv, D, generator=g) * 2
        k[..., 3] *= 8  # an outlier channel, as real keys have
        ks.write(slots, k.to(DEV))
        vs.write(slots, torch.randn(n, Hkv, D, generator=g).to(DEV))
    qp = torch.randn(gm.num_seqs, gm.max_q, H, D, generator=g).to(DEV)
    return qp, ks, vs, gm


SCHEMES = ["turbo", "turbo:k4v3", "turbo:k8v5", "turbo:ck4v2", "affine4", "affine8"]


@here
@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("splits,bcast,runs", [(2, False, False), (1, True, False), (2, True, True), (1, True, True)])
def test_kernel_equals_dequantize_then_attend(scheme, splits, bcast, runs):
    # decode (1 row), a verify window (4 rows) and a shorter one in the same padded batch;
    # one split writes the output directly; bcast loads group scales once per row (per-element
    # path); runs decodes whole runs of codes per load (test_runs_path_is_taken says where)
    qp, ks, vs, gm = _case(scheme, [(37, 1), (20, 4), (9, 2)])
    assert fused_supported(ks, vs, gm.max_q, qp.shape[2])
    bias = gm.additive_mask(torch.float32)
    out = encoded_decode_attention(qp, ks, vs, gm.gather_slots, bias, 0.125, None, num_splits=splits, block_n=16,
                                   group_bcast=bcast, runs=runs)
    ref = _reference(qp, ks, vs, gm.gather_slots, gm.mask, 0.125, None)
    assert out.shape == ref.shape
    torch.testing.assert_close(out, ref, atol=2e-4, rtol=2e-4)


@here
@pytest.mark.parametrize("scheme", ["turbo", "affine4", "turbo:ck4v2"])
@pytest.mark.parametrize("early_v,prefetch", [(True, False), (False, True), (True, True)])
def test_runs_scheduling_variants(scheme, early_v, prefetch):
    # values loaded before q.k, and slots loaded one tile ahead: the same function of the cache
    qp, ks, vs, gm = _case(scheme, [(37, 1), (20, 4), (9, 2)], seed=6)
    bias = gm.additive_mask(torch.float32)
    out = encoded_decode_attention(qp, ks, vs, gm.gather_slots, bias, 0.125, None, num_splits=2, block_n=16,
                                   runs=True, early_v=early_v, prefetch=prefetch)
    ref = _reference(qp, ks, vs, gm.gather_slots, gm.mask, 0.125, None)
    torch.testing.assert_close(out, ref, atol=2e-4, rtol=2e-4)


def test_runs_path_is_taken():
    # the runs decode must cover the schemes it claims (else the test above checks the old path twice)
    from augury.kv.codecs.triton_attention import _side_args, runs_supported

    def sides(scheme, D=64):
        codec = parse_codec(scheme, group_size=32 if scheme.startswith("affine") else None)
        codec.bind(D)
        out = []
        for side in (codec.key, codec.value):
            st = EncodedStore(side, 8, 2, D, torch.float32, "cpu")
            codes, _, _, kind, bits, group = _side_args(st)
            out.append(runs_supported(kind, bits, group, D, codes))
        return out

    assert sides("turbo") == [True, True]
    assert sides("turbo:k4v3") == [True, True]
    assert sides("turbo:ck4v2") == [True, True]  # 4-bit codebook keys through the pair table
    assert sides("affine4") == [True, True] and sides("affine8") == [True, True]
    assert sides("turbo:k8v5") == [True, False]  # 5-bit codebook values: per-element path
    assert sides("affine4", D=96) == [False, False]  # not a power of two


def test_pair_table_holds_adjacent_centroids():
    from augury.kv.codecs.triton_attention import pair_table
    from augury.kv.codecs.turboquant import codebook

    for bits in (2, 3, 4):
        c, t = codebook(bits), pair_table(bits, torch.device("cpu"))
        n = 1 << bits
        lo = (t & 0xFFFFFFFF).to(torch.int32).view(torch.float32)
        hi = (t >> 32).to(torch.int32).view(torch.float32)
        a, b = torch.arange(n * n) % n, torch.arange(n * n) // n
        assert torch.equal(lo, c[a]) and torch.equal(hi, c[b])


@here
def test_kernel_softcap_window_and_mqa():
    qp, ks, vs, gm = _case("turbo:k8v3", [(30, 1), (13, 3)], H=4, Hkv=1, window=10, seed=1)
    bias = gm.additive_mask(torch.float32)
    out = encoded_decode_attention(qp, ks, vs, gm.gather_slots, bias, 0.2, 5.0, block_n=16)
    ref = _reference(qp, ks, vs, gm.gather_slots, gm.mask, 0.2, 5.0)
    torch.testing.assert_close(out, ref, atol=2e-4, rtol=2e-4)


@here
def test_splits_merge_to_the_same_result():
    qp, ks, vs, gm = _case("turbo", [(60, 1)], seed=2)
    bias = gm.additive_mask(torch.float32)
    one = encoded_decode_attention(qp, ks, vs, gm.gather_slots, bias, 0.125, num_splits=1, block_n=16)
    many = encoded_decode_attention(qp, ks, vs, gm.gather_slots, bias, 0.125, num_splits=4, block_n=16)
    torch.testing.assert_close(one, many, atol=1e-5, rtol=1e-5)


def test_unknown_codecs_are_refused():
    # a codec the kernels do not know (or a subclass that may store other fields) keeps the eager path
    from augury.kv.codecs.affine import AffineCodec
    from augury.kv.codecs.triton_attention import side_supported
    from augury.kv.codecs.triton_encode import write_supported

    class Variant(AffineCodec):
        pass

    codec = parse_codec("affine4", group_size=32)
    codec.bind(64)
    assert side_supported(codec.key) and write_supported(codec.key)
    variant = object.__new__(Variant)
    variant.__dict__.update(codec.key.__dict__)
    assert not side_supported(variant) and not write_supported(variant)
    other = types.SimpleNamespace(bits=4, group_size=32)  # duck-typed look-alike
    assert not side_supported(other) and not write_supported(other)
    try:
        from augury.kv.codecs.qjl import QJLResidualCodec
    except ImportError:  # not landed yet
        return
    qjl = object.__new__(QJLResidualCodec)
    assert not side_supported(qjl) and not write_supported(qjl)


@here
def test_wide_steps_are_left_to_the_eager_path():
    _, ks, vs, _ = _case("turbo", [(8, 1)])
    assert not fused_supported(ks, vs, max_q=64, num_heads=4)


@pytest.mark.skipif(FRESH, reason="this process runs the checks itself")
def test_in_fresh_process():
    rerun_in_fresh_process(__file__, timeout=600)


@here
@pytest.mark.parametrize("scheme", ["turbo:rk4v3", "affine4-rk"])
def test_wiring_matches_the_eager_path_on_mixed_steps(scheme):
    """What encoded_paged_attention runs on CUDA (segments, padding, rotations) equals its CPU path."""
    from augury.kv.codecs.attention import _fused_attend
    from augury.layers.attention import attend

    # decodes first, then verify windows of different widths: two segments, padded rows
    qp, ks, vs, gm = _case(scheme, [(17, 1), (30, 1), (12, 4), (5, 2)], seed=3)
    assert gm.parts is not None and gm.q_index is not None
    T = 1 + 1 + 4 + 2
    q = torch.randn(T, qp.shape[2], qp.shape[3], generator=torch.Generator().manual_seed(5)).to(DEV)
    q = ks.rotation.rotate(q)
    fused = _fused_attend(q, ks, vs, gm, 0.125, None)
    eager = attend(q, ks.read, vs.read, gm, 0.125, None)
    torch.testing.assert_close(fused, eager, atol=2e-4, rtol=2e-4)


@here
@pytest.mark.parametrize("scheme", ["turbo", "turbo:rk4v3", "turbo:ck5v2", "affine4", "affine8", "turbo:k8v5"])
def test_fused_write_stores_what_the_torch_encoder_stores(scheme):
    from augury.kv.codecs.triton_encode import encode_write, write_supported

    g = torch.Generator().manual_seed(7)
    Hkv, D, n_slots = 2, 64, 40
    codec = parse_codec(scheme, group_size=32 if scheme.startswith("affine") else None)
    codec.bind(D)
    for side in (codec.key, codec.value):
        assert write_supported(side)
        ref = EncodedStore(side, n_slots, Hkv, D, torch.float32, DEV)
        got = EncodedStore(side, n_slots, Hkv, D, torch.float32, DEV)
        slots = torch.randperm(n_slots, generator=g)[:23].to(DEV)
        x = (torch.randn(23, Hkv, D, generator=g) * 3).to(DEV)
        x[:, :, 5] *= 10
        x[0, 1] = 0.5  # a flat row: the scale floor
        ref.write(slots, x)
        encode_write(got, slots, x)
        for name, a, b in zip([f.name for f in ref.fields], ref.parts, got.parts):
            if name == "codes":
                # ties round half up here, half to even in torch: at most a rare differing byte
                assert (a != b).float().mean() < 0.01, name
            else:
                torch.testing.assert_close(a, b, atol=1e-3, rtol=1e-3)
        off = (ref.read(slots) - got.read(slots)).abs() > 1e-3
        assert off.float().mean() < 0.01  # only where a code differs (a tie, or a rotation ulp on the GPU)


@here
def test_half_precision_compute_dtype():
    # fp16 exercises the casts a bf16 model takes on the GPU (the interpreter's bf16 tl.dot is not exact)
    dt = torch.float16
    qp, ks, vs, gm = _case("turbo:rk4v3", [(37, 1), (20, 4)], seed=4)
    ks.dtype = vs.dtype = dt
    q = qp.to(dt)
    out = encoded_decode_attention(q, ks, vs, gm.gather_slots, gm.additive_mask(dt), 0.125, None, num_splits=2,
                                   block_n=32)
    assert out.dtype == dt
    ref = _reference(q, ks, vs, gm.gather_slots, gm.mask, 0.125, None)
    torch.testing.assert_close(out.float(), ref.float(), atol=3e-3, rtol=3e-3)
