"""QJL 1-bit key residual: the estimator, its packing, its cost in error, determinism, the engine."""

from __future__ import annotations

import importlib.util
import math
import os
import sys

import pytest
import torch

from augury.kv.codecs import (
    AffineCodec,
    CodecError,
    EncodedStore,
    QJLResidualCodec,
    TurboCodec,
    codec_from_request,
    parse_codec,
)
from augury.kv.codecs.packing import pack_bits, unpack_bits
from augury.kv.codecs.qjl import QJL_SEED, sketch_matrix

D = 64


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _ip(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    return (q * k).sum(-1)


def _roundtrip(codec, x: torch.Tensor) -> torch.Tensor:
    codec.bind(x.shape[-1])
    return codec.decode_full(codec.encode(x, torch.float32), torch.float32)


def test_sketch_is_standard_normal_and_pinned():
    s = sketch_matrix(256, 64)
    assert s.shape == (256, 64) and s.dtype == torch.float32
    assert abs(float(s.mean())) < 0.02 and abs(float(s.var()) - 1) < 0.03
    # a pure function of (m, D, seed): the same on every machine, so SSD-restored signs decode the same
    assert torch.equal(s, sketch_matrix(256, 64))
    assert not torch.equal(s, sketch_matrix(256, 64, QJL_SEED + 1))
    assert torch.equal(sketch_matrix(64, 64), sketch_matrix(64, 64, QJL_SEED))
    pinned = [round(float(v), 4) for v in sketch_matrix(8, 8).flatten()[:4]]
    assert pinned == [round(float(v), 4) for v in sketch_matrix(8, 8).flatten()[:4]]
    assert pinned == PINNED_SKETCH


PINNED_SKETCH = [0.9139, 0.694, 0.666, -2.0999]


def test_estimator_is_unbiased_over_sketches():
    # a fixed (q, k) pair; the base (2-bit affine) leaves a large residual r. Over many independent
    # sketches the mean of q·(k̂ + r̂) must land on q·k within a few standard errors.
    q = torch.randn(1, 1, D, generator=_gen(1))
    k = torch.randn(1, 1, D, generator=_gen(2))
    base = AffineCodec(2, 32)
    k_base = _roundtrip(base, k)
    r = k - k_base
    est = torch.stack([_ip(q, _roundtrip(QJLResidualCodec(base, seed=s), k)) for s in range(400)]).flatten()
    se = float(est.std()) / math.sqrt(len(est))
    truth, uncorrected = float(_ip(q, k)), float(_ip(q, k_base))
    assert abs(float(est.mean()) - truth) < 4 * se
    # the per-sketch spread is the theoretical one: Var = ‖r‖²(π/2)/m·(‖q‖² − (2/π)(q·r/‖r‖)²)
    qr, rn, qn = float(_ip(q, r)), float(r.norm()), float(q.norm())
    var = rn**2 * (math.pi / 2) / D * (qn**2 - (2 / math.pi) * (qr / rn) ** 2)
    assert float(est.var()) == pytest.approx(var, rel=0.2)
    # and the pair was not a trivial one: leaving r out is off by far more than the standard error
    assert abs(uncorrected - truth) > 4 * se


def test_estimator_scale_over_vectors():
    # one fixed sketch, many vectors: regressing q·r̂ on q·r gives slope 1 (a wrong constant, e.g. a
    # missing sqrt(π/2), would give 0.8 or 1.25)
    n = 4000
    q = torch.randn(n, 1, D, generator=_gen(3))
    k = torch.randn(n, 1, D, generator=_gen(4))
    base = AffineCodec(2, 32)
    r = k - _roundtrip(base, k)
    r_hat = _roundtrip(QJLResidualCodec(base), k) - _roundtrip(base, k)
    t, e = _ip(q, r).flatten(), _ip(q, r_hat).flatten()
    assert float((t * e).sum() / (t * t).sum()) == pytest.approx(1.0, abs=0.05)


@pytest.mark.parametrize("n", [8, 64, 256])
def test_sign_bits_round_trip(n):
    signs = (torch.randn(3, 2, n, generator=_gen(n)) >= 0).to(torch.uint8)
    packed = pack_bits(signs, 1)
    assert packed.shape == (3, 2, n // 8) and packed.dtype == torch.uint8
    assert torch.equal(unpack_bits(packed, 1, n), signs.to(torch.int64))


def test_stored_signs_are_the_sketch_signs_of_the_residual():
    base = AffineCodec(4, 32, rotate=True)
    c = QJLResidualCodec(base)
    c.bind(D)
    k = torch.randn(5, 2, D, generator=_gen(5))
    parts = c.encode(k, torch.float32)
    assert [tuple(p.shape) for p in parts] == [(5, *f.shape) for f in c.fields(2, D, torch.float32)]
    r = base.rotation.rotate(k) - base.decode(parts[:3], torch.float32)  # the residual in the stored basis
    want = (r @ sketch_matrix(D, D).t() >= 0).to(torch.int64)
    assert torch.equal(unpack_bits(parts[3], 1, D), want)
    assert torch.allclose(parts[4].float(), r.norm(dim=-1), rtol=1e-3)


def test_inner_product_error_unbiased_but_costs_variance():
    """What the residual buys in q·k error: the base codec's bias goes away (slope 1), and the error
    shrinks once the sketch is wide enough; at m = D its variance (≈ π/2·‖q‖²‖r‖²/m) exceeds the
    residual it replaces (≈ ‖q‖²‖r‖²/D) — why `augury eval kv` measures it before it is used."""
    n = 3000
    q = torch.randn(n, 1, D, generator=_gen(6))
    k = torch.randn(n, 1, D, generator=_gen(7))
    t = _ip(q, k)

    def mse(c):
        return float((_ip(q, _roundtrip(c, k)) - t).pow(2).mean())

    def slope(c):
        e = _ip(q, _roundtrip(c, k))
        return float((t * e).sum() / (t * t).sum())

    base = AffineCodec(4, 32, rotate=True)
    assert mse(QJLResidualCodec(base, sketch_dim=4 * D)) < 0.6 * mse(base)
    ratio = mse(QJLResidualCodec(base)) / mse(base)
    assert 1.2 < ratio < 2.0  # ≈ π/2: unbiased, not lower-variance
    # a biased base: a 2-bit Lloyd-Max codebook shrinks q·k; the residual restores the scale
    cb = TurboCodec(2, 32, seed=0x6B)
    assert slope(cb) < 0.93
    assert slope(QJLResidualCodec(cb)) == pytest.approx(1.0, abs=0.02)


def test_deterministic_bytes():
    k = torch.randn(7, 2, D, generator=_gen(8))
    a = parse_codec("turbo:rk4v3+qjl")
    b = parse_codec("turbo:rk4v3+qjl")  # fresh instances: nothing cached decides the bytes
    a.bind(D), b.bind(D)
    pa, pb = a.key.encode(k, torch.float32), b.key.encode(k, torch.float32)
    assert all(torch.equal(x, y) for x, y in zip(pa, pb))
    assert torch.equal(a.key.decode(pa, torch.float32), b.key.decode(pb, torch.float32))


def test_names_ids_and_bits():
    c = parse_codec("turbo:rk4v3+qjl")
    assert isinstance(c.key, QJLResidualCodec) and isinstance(c.key.base, AffineCodec) and c.key.base.rotate
    assert c.name == "turbo-rk4v3+qjl"
    plain = parse_codec("turbo:rk4v3")
    # the id carries the sketch size and seed: a prefix cached under one never serves another
    ids = {plain.id, c.id, parse_codec("turbo:rk4v3+qjl128").id,
           type(c)(QJLResidualCodec(c.key.base, seed=1), c.value).id}
    assert len(ids) == 4 and "qjl" in c.id and f"{QJL_SEED:x}" in c.id
    # m = D sign bits + one fp16 norm per head vector, on the keys only
    assert c.key.bits_per_element(D, torch.bfloat16) == plain.key.bits_per_element(D, torch.bfloat16) + 1 + 16 / D
    assert c.value.id == plain.value.id
    assert parse_codec("affine4-rk+qjl").key.base.bits == 4
    with pytest.raises(CodecError):
        parse_codec("native+qjl")
    with pytest.raises(CodecError):
        parse_codec("turbo:rk4v3+qjl12")  # not a multiple of 8


def test_api_kv_cache_qjl():
    default = parse_codec("native")
    c = codec_from_request({"codec": "turbo", "key_bits": 4, "value_bits": 3, "rotate_keys": True, "qjl": True},
                           default)
    assert c.id == parse_codec("turbo:rk4v3+qjl").id
    assert codec_from_request({"codec": "turbo", "qjl": True, "qjl_dim": 128}, default).id == \
        parse_codec("turbo:k8v3+qjl128").id
    assert codec_from_request({"codec": "turbo", "qjl": False}, default).id == parse_codec("turbo").id
    # a server default that already has it is kept; a native one cannot take it
    d = parse_codec("turbo:rk4v3+qjl")
    assert codec_from_request({"qjl": True}, d).id == d.id
    with pytest.raises(CodecError):
        codec_from_request({"qjl": True}, default)


def test_store_reads_through_decode():
    c = parse_codec("turbo:rk4v3+qjl")
    store = EncodedStore(c.key, 16, 2, D, torch.float32, "cpu")
    k = torch.randn(4, 2, D, generator=_gen(9))
    slots = torch.tensor([3, 0, 9, 15])
    store.write(slots, k)
    assert torch.equal(store.read(slots), c.key.decode(c.key.encode(k, torch.float32), torch.float32))
    assert store.rotation is c.key.base.rotation is not None


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
def test_fused_kernels_refuse_it():
    # the fused encode and attention kernels know affine/turbo bytes only: QJL must take the eager path
    if not torch.cuda.is_available() and "triton" not in sys.modules:
        os.environ["TRITON_INTERPRET"] = "1"  # as tests/kv/test_codecs_triton.py: set before triton loads
    from augury.kv.codecs.triton_attention import side_supported
    from augury.kv.codecs.triton_encode import write_supported

    c = parse_codec("turbo:rk4v3+qjl")
    assert side_supported(c.key.base) and write_supported(c.key.base)
    assert not side_supported(c.key) and not write_supported(c.key)


# -- the engine ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def hd64_dir(tmp_path_factory):
    from tests.conftest import make_tiny_hf_model

    return make_tiny_hf_model(tmp_path_factory.mktemp("tiny_qjl"), "llama", hidden_size=128,
                              num_attention_heads=2, num_key_value_heads=1)


def _prompts(n):
    g = _gen(3)
    return [torch.randint(3, 300, (20 + 5 * i,), generator=g).tolist() for i in range(n)]


def test_engine_serves_qjl(hd64_dir):
    from augury.engine.engine import Engine
    from augury.engine.types import SamplingParams

    greedy = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)
    kw = dict(device="cpu", dtype="float32", progress=False, kv_budget="2MiB")
    with Engine.from_model(str(hd64_dir), kv_quant="turbo:rk4v3+qjl", **kw) as e:
        assert e.stats()["kv_codec"] == parse_codec("turbo:rk4v3+qjl").id
        p = _prompts(1)[0] + list(range(40, 80))
        e.blocks.reset_prefix_cache()
        miss = e.generate(p, greedy)
        hit = e.generate(p, greedy)
        assert len(miss.token_ids) == 10
        assert miss.cached_tokens == 0 and hit.cached_tokens > 0 and hit.token_ids == miss.token_ids
        assert e.wait_idle()
        e.blocks.reset_prefix_cache()
        assert e.blocks.num_free_blocks() == e.blocks.num_total_blocks()
    # near-lossless base + residual: the residual's noise is as small as the 8-bit error it sketches
    with Engine.from_model(str(hd64_dir), **kw) as nat, \
            Engine.from_model(str(hd64_dir), kv_quant="turbo:k8v8+qjl", **kw) as enc:
        for p in _prompts(3):
            assert enc.generate(p, greedy).token_ids == nat.generate(p, greedy).token_ids
