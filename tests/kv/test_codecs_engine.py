"""Encoded KV in the engine: start-up checks, billing, batching, prefix hits, leaks, request policy."""

from __future__ import annotations

import pytest
import torch

from augury.config import ConfigError, EngineConfig
from augury.engine.engine import Engine
from augury.engine.types import SamplingParams
from augury.kv.codecs import CodecError
from tests.conftest import make_tiny_hf_model

GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)


def _engine(path, **kw) -> Engine:
    kw.setdefault("kv_budget", "2MiB")
    return Engine.from_model(str(path), device="cpu", dtype="float32", progress=False, **kw)


def _prompts(n):
    g = torch.Generator().manual_seed(3)
    return [torch.randint(3, 300, (20 + 5 * i,), generator=g).tolist() for i in range(n)]


@pytest.fixture(scope="module")
def turbo(hd64_dir):
    e = _engine(hd64_dir, kv_quant="turbo")
    yield e
    e.shutdown()


def test_pool_is_encoded_and_bills_encoded_bytes(turbo, hd64_dir):
    native = _engine(hd64_dir)
    try:
        assert turbo.stats()["kv_codec"] == turbo.kv_codec.id != native.kv_codec.id
        # same byte budget, fp32 native (32 bits) vs 6.25 bits/element
        ratio = turbo.blocks.num_total_blocks() / native.blocks.num_total_blocks()
        assert ratio == pytest.approx(32 / 6.25, rel=0.02)
        assert turbo.pool.nbytes() <= 2 * 1024**2
        # the codec is each block's storage class: part of every block hash
        assert turbo.blocks.class_names() == [turbo.kv_codec.id] and native.blocks.class_names() == [""]
    finally:
        native.shutdown()


def test_batch_equals_alone_and_nothing_leaks(turbo):
    ps = _prompts(5)
    alone = [turbo.generate(p, GREEDY).token_ids for p in ps]
    together = [r.token_ids for r in turbo.generate_batch(ps, GREEDY)]
    assert together == alone
    assert turbo.wait_idle()
    turbo.blocks.reset_prefix_cache()
    assert turbo.blocks.num_free_blocks() == turbo.blocks.num_total_blocks()


def test_prefix_hit_equals_miss(turbo):
    p = _prompts(1)[0] + list(range(40, 80))
    turbo.blocks.reset_prefix_cache()
    miss = turbo.generate(p, GREEDY)
    hit = turbo.generate(p, GREEDY)
    assert miss.cached_tokens == 0 and hit.cached_tokens > 0
    assert hit.token_ids == miss.token_ids


def test_high_precision_codec_keeps_greedy_tokens(hd64_dir):
    ps = _prompts(3)
    with _engine(hd64_dir) as nat, _engine(hd64_dir, kv_quant="turbo:k8v8") as enc:
        for p in ps:
            assert enc.generate(p, GREEDY).token_ids == nat.generate(p, GREEDY).token_ids


def test_request_policy(turbo):
    p = _prompts(1)[0]
    ok = SamplingParams(max_tokens=2, temperature=0.0, kv_cache={"codec": "turbo", "key_bits": 8, "value_bits": 3})
    assert len(turbo.generate(p, ok).token_ids) == 2
    for bad in ({"codec": "native"}, {"codec": "turbo", "value_bits": 4}, {"codec": "zip"}, {"bits": 3}):
        with pytest.raises(ValueError, match="kv_cache"):
            turbo.submit(p, SamplingParams(max_tokens=2, kv_cache=bad))


def test_head_dims_the_codec_cannot_take_are_refused(tmp_path):
    d16 = make_tiny_hf_model(tmp_path / "hd16", "llama")  # head_dim 16 < turbo's group of 32
    with pytest.raises(CodecError, match="does not divide head_dim 16"):
        _engine(d16, kv_quant="turbo")
    d96 = make_tiny_hf_model(tmp_path / "hd96", "llama", hidden_size=192, num_attention_heads=2,
                             num_key_value_heads=1)
    with pytest.raises(CodecError, match="power-of-two head_dim"):
        _engine(d96, kv_quant="turbo")
    _engine(d96, kv_bits=4, kv_group_size=32).shutdown()  # affine takes it


def test_flags_validate():
    with pytest.raises(ConfigError):
        EngineConfig(kv_quant="turbo:k8v9").validate()
    with pytest.raises(ConfigError, match="kv-extra-codecs"):
        EngineConfig(kv_extra_codecs="native,turbo:k8v9").validate()
    with pytest.raises(ConfigError, match="kv-extra-share"):
        EngineConfig(kv_extra_share=1.5).validate()
    EngineConfig(kv_bits=4, quantized_kv_start=64).validate()
    assert EngineConfig(kv_bits=8).kv_codec().name == "affine8"
