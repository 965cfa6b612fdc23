"""Rope vs HF transformers: inverse frequencies per rope type and the rotation itself."""

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")

from augury.config import ConfigError, ModelConfig, RopeConfig  # noqa: E402
from augury.layers.rope import RotaryEmbedding, apply_rope, rope_inv_freq  # noqa: E402

HEAD_DIM = 32
ROPES = {
    "default": dict(rope_type="default", rope_theta=10000.0),
    "linear": dict(rope_type="linear", rope_theta=500000.0, factor=4.0),
    "llama3": dict(rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0,
                   high_freq_factor=4.0, original_max_position_embeddings=64),
}


def hf_llama_config(rope):
    return transformers.LlamaConfig(
        hidden_size=4 * HEAD_DIM, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=4096, rope_parameters=rope,
    )


@pytest.mark.parametrize("kind", list(ROPES))
def test_inv_freq_and_rotation_match_hf(kind):
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    hf_cfg = hf_llama_config(ROPES[kind])
    cfg = ModelConfig.from_hf_dict(hf_cfg.to_dict())
    assert cfg.rope.rope_type == kind
    hf_rope = LlamaRotaryEmbedding(hf_cfg)
    torch.testing.assert_close(rope_inv_freq(cfg.rope, HEAD_DIM), hf_rope.inv_freq, atol=0, rtol=0)

    positions = torch.tensor([0, 1, 5, 17, 63, 64, 200, 3000, 4095])
    q = torch.randn(len(positions), 4, HEAD_DIM)
    k = torch.randn(len(positions), 2, HEAD_DIM)
    cos_hf, sin_hf = hf_rope(q, positions[None])
    # HF layout: [B, heads, T, D]
    q_hf, k_hf = apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos_hf, sin_hf)
    ours = RotaryEmbedding(cfg.rope, HEAD_DIM, 4096)
    cos, sin = ours(positions)
    torch.testing.assert_close(apply_rope(q, cos, sin), q_hf[0].transpose(0, 1), atol=1e-6, rtol=0)
    torch.testing.assert_close(apply_rope(k, cos, sin), k_hf[0].transpose(0, 1), atol=1e-6, rtol=0)


def test_gemma3_local_and_global_bases():
    from transformers.models.gemma3.modeling_gemma3 import Gemma3RotaryEmbedding

    hf_cfg = transformers.Gemma3TextConfig(
        hidden_size=64, num_attention_heads=4, num_key_value_heads=1, head_dim=HEAD_DIM,
        rope_theta=1_000_000.0, rope_local_base_freq=10_000.0, num_hidden_layers=2,
        layer_types=["sliding_attention", "full_attention"], sliding_window=8,
    )
    cfg = ModelConfig.from_hf_dict(hf_cfg.to_dict())
    hf_rope = Gemma3RotaryEmbedding(hf_cfg)
    torch.testing.assert_close(rope_inv_freq(cfg.rope, HEAD_DIM), hf_rope.full_attention_inv_freq, atol=0, rtol=0)
    torch.testing.assert_close(rope_inv_freq(cfg.rope_local, HEAD_DIM), hf_rope.sliding_attention_inv_freq, atol=0, rtol=0)


def test_bf16_cache_is_the_rounded_fp32_table():
    rope = RopeConfig(theta=10000.0)
    pos = torch.arange(0, 300, 7)
    c32, s32 = RotaryEmbedding(rope, HEAD_DIM, 300)(pos)
    c16, s16 = RotaryEmbedding(rope, HEAD_DIM, 300, dtype=torch.bfloat16)(pos)
    assert torch.equal(c32.to(torch.bfloat16), c16) and torch.equal(s32.to(torch.bfloat16), s16)


def test_unsupported_rope_type_is_a_clear_error():
    with pytest.raises(ConfigError, match="yarn"):
        rope_inv_freq(RopeConfig(rope_type="yarn"), HEAD_DIM)
