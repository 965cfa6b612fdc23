"""`augury eval kv` harness and `augury fit` arithmetic on tiny models."""

from __future__ import annotations

import json

import pytest
import torch

from augury.config import EngineConfig, ModelConfig
from augury.engine.loader import load_model
from augury.eval.kv import SchemeResult, evaluate_kv, format_table, layer_codecs, run_meta, to_json
from augury.fit import fit, kv_bytes, weight_bytes
from augury.kv.codecs import parse_codec
from augury.kv.block_manager import KVGroup
from augury.kv.pool import KVPool, plan_groups
from tests.conftest import make_tiny_hf_model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = make_tiny_hf_model(tmp_path_factory.mktemp("tiny_eval"), "llama", hidden_size=128,
                           num_attention_heads=2, num_key_value_heads=1)
    return load_model(EngineConfig(model=str(d), device="cpu", dtype="float32", progress=False))


def test_eval_kv_orders_schemes_sensibly(tiny):
    res = evaluate_kv(tiny, ("native", "turbo:k8v8", "affine4", "turbo:k2v2"), passage_tokens=48,
                      passkey_ctx=64, passkey_trials=1)
    by = {r.name: r for r in res}
    assert by["native"].kl == 0 and by["native"].greedy_agreement == 1 and by["native"].compression == 1
    assert by["turbo:k8v8"].kl < by["affine4"].kl < by["turbo:k2v2"].kl
    assert by["turbo:k2v2"].compression == pytest.approx(16 / 2.75, abs=1e-3)
    doc = json.loads(to_json(res))
    assert {"name", "bits_per_element", "compression", "kl", "greedy_agreement", "passkey"} <= set(doc["schemes"][0])
    assert "turbo:k2v2" in format_table(res)
    # the JSON says which codec each layer group stored (this model has full-attention layers only)
    assert doc["schemes"][1]["layer_codecs"] == {"full": parse_codec("turbo:k8v8").id}
    assert by["native"].layer_codecs == {"full": "native"}


def test_eval_kv_qjl_scheme_and_meta(tiny):
    res = evaluate_kv(tiny, ("turbo:rk4v3", "turbo:rk4v3+qjl"), passage_tokens=32, passkey_trials=0,
                      num_passages=2)
    plain, qjl = res
    # keys pay m = D sign bits + a fp16 norm per head vector: (1 + 16/64) / 2 per K/V element
    assert qjl.bits_per_element == pytest.approx(plain.bits_per_element + 0.625)
    assert qjl.kl > 0 and "qjl" in qjl.layer_codecs["full"]
    meta = run_meta(tiny, "tiny", "float32", 2, 32, 0, 0)
    assert meta["passages"] == 2 and meta["sliding_layers"] == 0 and meta["head_dim"] == 64
    doc = json.loads(to_json(res, meta))
    assert doc["meta"]["passages"] == 2 and [s["name"] for s in doc["schemes"]] == ["turbo:rk4v3", "turbo:rk4v3+qjl"]


def test_layer_codecs_name_the_sliding_group():
    # Gemma-3-like: sliding-window layers store K/V with the same codec as full ones, and the report says so
    cfg = ModelConfig("gemma3_text", 100, 32, 64, 3, 2, 1, 32, sliding_window=16,
                      layer_types=("sliding_attention", "sliding_attention", "full_attention"))
    codec = parse_codec("turbo:k8v3")
    pool = KVPool.allocate(cfg, [KVGroup("full", 4, None), KVGroup("sliding", 4, 16)], 16, torch.float32,
                           torch.device("cpu"), codec)
    lc = layer_codecs(pool)
    assert lc == {"sliding": codec.id, "full": codec.id}
    r = SchemeResult("turbo:k8v3", codec.id, 6.25, 2.56, 0.0, 1.0, 1.0, lc)
    assert format_table([r]).splitlines()[1].endswith("same")
    r.layer_codecs = {"full": codec.id, "sliding": "native"}
    assert format_table([r]).splitlines()[1].endswith("native")


def test_fit_matches_engine_block_billing():
    cfg = ModelConfig("llama", 1000, 128, 256, 4, 2, 1, 64)
    codec = parse_codec("turbo:k4v3")
    bf = torch.bfloat16
    budget = 8 * 1024**2
    groups = plan_groups(cfg, bf, budget, 16, 4, 64, codec)
    # the tokens admission can hold are what fit's KV arithmetic says fits the same bytes
    tokens = groups[0].num_blocks * 16
    assert kv_bytes(cfg, tokens, 1, codec, bf) <= budget < kv_bytes(cfg, tokens + 16, 1, codec, bf)
    r = fit(cfg, 4096, 2, codec, "native", bf, budget_bytes=64 * 1024**2)
    assert r.total_bytes == r.weights_bytes + r.kv_bytes + r.activation_bytes
    assert fit(cfg, r.max_context, 2, codec, "native", bf).total_bytes <= 64 * 1024**2
    assert fit(cfg, r.max_context + 16, 2, codec, "native", bf).total_bytes > 64 * 1024**2
    assert weight_bytes(cfg, "int4") < weight_bytes(cfg, "int8") < weight_bytes(cfg, "native", torch.float32)


def test_fit_8b_shape_compression_targets():
    # Llama-3-8B shape: 16.06 GB of bf16 weights (FACTS.md)
    cfg = ModelConfig("llama", 128256, 4096, 14336, 32, 32, 8, 128, max_position_embeddings=8192)
    assert weight_bytes(cfg) == pytest.approx(16.06e9, rel=1e-3)
    nat = kv_bytes(cfg, 8192, 1, parse_codec("native"), torch.bfloat16)
    assert nat / kv_bytes(cfg, 8192, 1, parse_codec("turbo:k4v3"), torch.bfloat16) >= 3.7
