"""Qwen2 (qkv bias) and Qwen3 (q/k norm) vs HF transformers fp32 (tiny random models)."""

import pytest

pytest.importorskip("transformers")

from oracle_helpers import check_decode, check_prefill, check_ragged, hf_and_augury  # noqa: E402

SMALL = dict(
    vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
)


@pytest.fixture(scope="module")
def qwen2(tmp_path_factory):
    from transformers import Qwen2Config

    return hf_and_augury(Qwen2Config(**SMALL, tie_word_embeddings=True), tmp_path_factory.mktemp("qwen2"), seed=3)


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    from transformers import Qwen3Config

    cfg = Qwen3Config(**SMALL, head_dim=32, tie_word_embeddings=False)
    return hf_and_augury(cfg, tmp_path_factory.mktemp("qwen3"), seed=4)


@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
def test_prefill(family, request):
    hf, model, _ = request.getfixturevalue(family)
    check_prefill(hf, model)


@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
def test_decode(family, request):
    hf, model, _ = request.getfixturevalue(family)
    check_decode(hf, model)


@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
def test_ragged_batch(family, request):
    hf, model, _ = request.getfixturevalue(family)
    check_ragged(hf, model)


def test_family_features_are_loaded(qwen2, qwen3):
    _, m2, c2 = qwen2
    _, m3, c3 = qwen3
    assert c2.model_type == "qwen2" and m2.layers[0].self_attn.qkv_proj.bias is not None
    assert m2.layers[0].self_attn.o_proj.bias is None
    assert c3.model_type == "qwen3" and c3.head_dim == 32 and m3.layers[0].self_attn.qk_norm is not None
