"""GGUF -> HF conventions: names, llama q/k un-permutation, gemma norm shift, config mapping."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from augury.config import ModelConfig
from augury.weights.errors import WeightsError
from augury.weights.gguf_config import (
    _llama3_divisors,
    config_from_metadata,
    generation_config,
    llama3_rope_from_freqs,
)
from augury.weights.gguf_file import GGUFSource, unpermute_rope_rows
from augury.weights.gguf_names import hf_name
from augury.weights.gguf_reader import read_header

from tests.weights.gguf_build import llama_cpp_permute, tiny_hf_model, write_gguf


@pytest.mark.parametrize("n_heads,rest", [(4, (64,)), (2, (64,)), (3, ())])
def test_unpermute_inverts_llama_cpp_permute(n_heads: int, rest: tuple[int, ...]) -> None:
    w = torch.randn(n_heads * 16, *rest)
    permuted = torch.from_numpy(llama_cpp_permute(w.numpy(), n_heads))
    assert not torch.equal(permuted, w)
    assert torch.equal(unpermute_rope_rows(permuted, n_heads), w)


def test_names() -> None:
    assert hf_name("llama", "token_embd.weight") == "model.embed_tokens.weight"
    assert hf_name("llama", "blk.3.ffn_norm.weight") == "model.layers.3.post_attention_layernorm.weight"
    assert hf_name("qwen2", "blk.0.attn_q.bias") == "model.layers.0.self_attn.q_proj.bias"
    assert hf_name("gemma3", "blk.1.ffn_norm.weight") == "model.layers.1.pre_feedforward_layernorm.weight"
    assert hf_name("gemma3", "blk.1.post_ffw_norm.weight") == "model.layers.1.post_feedforward_layernorm.weight"
    assert hf_name("qwen3", "blk.2.attn_k_norm.weight") == "model.layers.2.self_attn.k_norm.weight"
    assert hf_name("llama", "rope_freqs.weight") is None
    with pytest.raises(WeightsError, match="no known HF name"):
        hf_name("llama", "blk.0.mystery.weight")
    with pytest.raises(WeightsError, match="not supported"):
        hf_name("falcon", "token_embd.weight")


@pytest.mark.parametrize("model_type,arch", [("llama", "llama"), ("qwen3", "qwen3"), ("gemma3_text", "gemma3")])
def test_f32_gguf_round_trips_to_hf_state_dict(tmp_path, model_type: str, arch: str) -> None:
    """HF model -> GGUF (as llama.cpp writes it) -> our loader == the original HF tensors."""
    cfg, model = tiny_hf_model(model_type)
    state = model.state_dict()
    path = write_gguf(tmp_path / "m.gguf", arch, cfg, state)
    src = GGUFSource(path)
    got = dict(src.iter_tensors())
    assert set(got) == set(state)
    for k, v in state.items():
        if arch == "gemma3" and k.endswith("norm.weight"):
            # stored as fp32 (1 + w): the shift rounds away low bits, so close but not bit-equal
            assert torch.allclose(got[k], v, rtol=0, atol=1e-6), k
        else:
            assert torch.equal(got[k], v.float()), k
    mc = ModelConfig.from_hf_dict(src.config)
    assert (mc.num_layers, mc.num_heads, mc.num_kv_heads, mc.head_dim) == (2, 4, 2, 16)
    assert mc.tie_word_embeddings is False  # output.weight present


def test_q8_gguf_matches_reference_dequant(tmp_path) -> None:
    cfg, model = tiny_hf_model("llama")
    state = model.state_dict()
    path = write_gguf(tmp_path / "q.gguf", "llama", cfg, state, quant=gguf.GGMLQuantizationType.Q8_0)
    got = dict(GGUFSource(path).iter_tensors())
    w = state["model.layers.1.mlp.down_proj.weight"].numpy()
    ref = gguf.quants.dequantize(gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q8_0), gguf.GGMLQuantizationType.Q8_0)
    assert torch.equal(got["model.layers.1.mlp.down_proj.weight"], torch.from_numpy(ref))
    # q_proj went through quantize(permuted) and back: still matches the HF layout closely
    q = state["model.layers.0.self_attn.q_proj.weight"]
    assert torch.allclose(got["model.layers.0.self_attn.q_proj.weight"], q, atol=0.05)


def test_tied_embeddings_when_output_absent(tmp_path) -> None:
    cfg, model = tiny_hf_model("llama", tie_word_embeddings=True)
    state = {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}
    src = GGUFSource(write_gguf(tmp_path / "t.gguf", "llama", cfg, state))
    assert src.config["tie_word_embeddings"] is True
    assert "lm_head.weight" not in src.tensor_names()


def _meta(arch: str, **extra) -> dict:
    base = {
        "general.architecture": arch,
        f"{arch}.embedding_length": 256,
        f"{arch}.attention.head_count": 8,
        f"{arch}.attention.head_count_kv": [2, 2, 2, 2],
        f"{arch}.block_count": 4,
        f"{arch}.feed_forward_length": 512,
        f"{arch}.context_length": 4096,
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
    }
    base.update({f"{arch}.{k}": v for k, v in extra.items()})
    return base


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "gemma3"])
def test_config_mapping_is_valid(arch: str) -> None:
    meta = _meta(arch, **{"attention.key_length": 32, "block_count": 7, "attention.head_count_kv": 2})
    mc = ModelConfig.from_hf_dict(config_from_metadata(meta, 1000, has_output=False))
    assert (mc.vocab_size, mc.num_layers, mc.num_kv_heads, mc.head_dim) == (1000, 7, 2, 32)
    assert mc.tie_word_embeddings and mc.eos_token_ids == (2,)
    assert mc.attention_bias == (arch == "qwen2")
    if arch == "gemma3":
        assert mc.layer_types == ("sliding_attention",) * 5 + ("full_attention", "sliding_attention")
        assert mc.query_pre_attn_scalar == 32 and mc.rope_local.theta == 10000.0


def test_config_errors() -> None:
    with pytest.raises(WeightsError, match="not supported"):
        config_from_metadata({"general.architecture": "mamba"}, 10, True)
    meta = _meta("llama")
    del meta["llama.block_count"]
    with pytest.raises(WeightsError, match="block_count"):
        config_from_metadata(meta, 10, True)
    with pytest.raises(WeightsError, match="varies per layer"):
        config_from_metadata(_meta("llama", **{"attention.head_count_kv": [1, 2, 2, 2]}), 10, True)


def test_rope_scaling_mapping() -> None:
    meta = _meta("llama", **{"rope.scaling.type": "linear", "rope.scaling.factor": 4.0})
    mc = ModelConfig.from_hf_dict(config_from_metadata(meta, 10, True))
    assert mc.rope.rope_type == "linear" and mc.rope.factor == 4.0


def test_llama3_rope_recovered_from_freqs() -> None:
    params = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
              "original_max_position_embeddings": 8192}
    freqs = _llama3_divisors(128, 500000.0, params).astype(np.float32)
    assert llama3_rope_from_freqs(freqs, 128, 500000.0) == params
    with pytest.warns(UserWarning, match="rope_freqs"):
        llama3_rope_from_freqs(freqs * 1.5, 128, 500000.0)


def test_generation_config_adds_end_of_turn() -> None:
    meta = {"tokenizer.ggml.eos_token_id": 1, "tokenizer.ggml.bos_token_id": 2,
            "tokenizer.ggml.tokens": ["<pad>", "<eos>", "<bos>", "<end_of_turn>", "<|im_end|>"],
            "tokenizer.ggml.token_type": [3, 3, 3, 3, 1]}
    # <|im_end|> here is a normal token (type 1), so it must not stop generation
    assert generation_config(meta) == {"eos_token_id": [1, 3], "bos_token_id": 2}


def test_truncated_gguf_is_rejected(tmp_path) -> None:
    cfg, model = tiny_hf_model("llama")
    path = write_gguf(tmp_path / "m.gguf", "llama", cfg, model.state_dict())
    data = path.read_bytes()
    (tmp_path / "short.gguf").write_bytes(data[: len(data) - 100])
    with pytest.raises(WeightsError, match="past the end"):
        read_header(tmp_path / "short.gguf")
    (tmp_path / "bad.gguf").write_bytes(b"GGML" + data[4:])
    with pytest.raises(WeightsError, match="not a GGUF"):
        read_header(tmp_path / "bad.gguf")


@pytest.mark.real
def test_smollm2_config(smollm2_gguf) -> None:
    src = GGUFSource(smollm2_gguf)
    mc = ModelConfig.from_hf_dict(src.config)
    assert (mc.model_type, mc.num_layers, mc.hidden_size, mc.num_heads, mc.num_kv_heads, mc.head_dim) == (
        "llama", 30, 576, 9, 3, 64)
    assert mc.tie_word_embeddings and mc.rope.theta == 100000.0 and mc.vocab_size == 49152
    ck = src.checkpoint()
    md = ck.tokenizer_files["metadata"]
    assert md["tokenizer.ggml.model"] == "gpt2" and len(md["tokenizer.ggml.tokens"]) == 49152
    assert isinstance(md["tokenizer.ggml.merges"], list) and "tokenizer.chat_template" in md
    assert 2 in ck.generation_config["eos_token_id"]
    assert len(ck.fingerprint) == 32 and GGUFSource(smollm2_gguf).fingerprint == ck.fingerprint


@pytest.mark.real
def test_gemma3_config(gemma3_gguf) -> None:
    src = GGUFSource(gemma3_gguf)
    mc = ModelConfig.from_hf_dict(src.config)
    assert (mc.model_type, mc.num_layers, mc.head_dim, mc.num_kv_heads) == ("gemma3_text", 18, 256, 1)
    assert mc.sliding_window == 512 and mc.query_pre_attn_scalar == 256
    assert mc.layer_types[5] == "full_attention" and mc.layer_types[4] == "sliding_attention"
    assert mc.rope.theta == 1_000_000.0 and mc.rope_local.theta == 10000.0
    assert mc.hidden_act == "gelu_pytorch_tanh" and mc.tie_word_embeddings
    assert src.checkpoint().generation_config["eos_token_id"] == [1, 106]


def test_checkpoint_helpers(tmp_path) -> None:
    cfg, model = tiny_hf_model("gemma3_text")
    src = GGUFSource(write_gguf(tmp_path / "g.gguf", "gemma3", cfg, model.state_dict()))
    ck = src.checkpoint()
    assert ck.model_config().model_type == "gemma3_text"
    assert ck.eos_token_ids() == (1, 95)  # GGUF eos + the <|im_end|> control token
