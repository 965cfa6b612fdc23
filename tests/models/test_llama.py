"""Llama family vs HF transformers fp32 (tiny random models)."""

import pytest
import torch

pytest.importorskip("transformers")

from oracle_helpers import check_bf16, check_decode, check_prefill, check_ragged, hf_and_augury  # noqa: E402


def llama_config(**kw):
    from transformers import LlamaConfig

    base = dict(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        rms_norm_eps=1e-5, tie_word_embeddings=False,
    )
    base.update(kw)
    return LlamaConfig(**base)


@pytest.fixture(scope="module")
def plain_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("llama")


@pytest.fixture(scope="module")
def plain(plain_dir):
    return hf_and_augury(llama_config(), plain_dir)


@pytest.fixture(scope="module")
def llama3_rope(tmp_path_factory):
    rope = dict(rope_type="llama3", rope_theta=50000.0, factor=8.0, low_freq_factor=1.0,
                high_freq_factor=4.0, original_max_position_embeddings=16)
    cfg = llama_config(rope_parameters=rope, tie_word_embeddings=True, attention_bias=True)
    return hf_and_augury(cfg, tmp_path_factory.mktemp("llama3"), seed=1)


def test_prefill(plain):
    hf, model, _ = plain
    check_prefill(hf, model)


def test_decode(plain):
    hf, model, _ = plain
    check_decode(hf, model)


def test_ragged_batch(plain):
    hf, model, _ = plain
    check_ragged(hf, model)


def test_bf16(plain, plain_dir):
    check_bf16(plain[0], plain_dir)


def test_llama3_rope_tied_bias(llama3_rope):
    hf, model, cfg = llama3_rope
    assert cfg.rope.rope_type == "llama3" and cfg.tie_word_embeddings and cfg.attention_bias
    check_prefill(hf, model, n=30)
    check_ragged(hf, model)


def test_mistral_sliding_window(tmp_path):
    from transformers import MistralConfig

    cfg = MistralConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
        sliding_window=6,
    )
    hf, model, mcfg = hf_and_augury(cfg, tmp_path, seed=2)
    assert mcfg.model_type == "llama" and mcfg.sliding_window == 6
    check_prefill(hf, model, n=20)
    check_decode(hf, model, n_prefill=7, n_decode=10)
    check_ragged(hf, model)


def test_missing_weight_is_a_clear_error(plain, tmp_path):
    from safetensors.torch import load_file

    from augury.models.base import WeightLoadError
    from augury.models.registry import build_model

    hf, model, cfg = plain
    sd = {k: v for k, v in hf.state_dict().items() if "layers.1.mlp.up_proj" not in k}
    fresh = build_model(cfg, "cpu", torch.float32, max_positions=64)
    with pytest.raises(WeightLoadError, match="layers.1.mlp.up_proj"):
        fresh.load_weights(sd.items())
    bad = dict(hf.state_dict())
    bad["model.layers.0.self_attn.k_proj.weight"] = torch.zeros(3, 3)
    with pytest.raises(WeightLoadError, match="k_proj"):
        fresh.load_weights(bad.items())
