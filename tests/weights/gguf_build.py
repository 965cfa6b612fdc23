"""Test helper: write small GGUF files from HF state dicts, the way llama.cpp's converter does."""

from __future__ import annotations

import re
from pathlib import Path

import gguf
import numpy as np
import torch

_TOP = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}
_LAYER = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
_LAYER_GEMMA = {
    "pre_feedforward_layernorm": "ffn_norm",
    "post_attention_layernorm": "post_attention_norm",
    "post_feedforward_layernorm": "post_ffw_norm",
}


def llama_cpp_permute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """llama.cpp's q/k row permutation (rotate-half -> interleaved pairs)."""
    return w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def gguf_name(arch: str, hf: str) -> str:
    if hf in _TOP:
        return _TOP[hf]
    m = re.match(r"model\.layers\.(\d+)\.(.+)\.(weight|bias)$", hf)
    assert m, hf
    part = m.group(2)
    table = {**_LAYER, **(_LAYER_GEMMA if arch == "gemma3" else {"post_attention_layernorm": "ffn_norm"})}
    return f"blk.{m.group(1)}.{table[part]}.{m.group(3)}"


def write_gguf(
    path: Path, arch: str, cfg: dict, state: dict[str, torch.Tensor], quant: gguf.GGMLQuantizationType | None = None
) -> Path:
    """cfg: HF config dict. quant: store 2-D weights in this type (F32 otherwise)."""
    w = gguf.GGUFWriter(str(path), arch)
    heads, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg.get("max_position_embeddings", 512))
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_layer_norm_rms_eps(cfg.get("rms_norm_eps", 1e-6))
    w.add_rope_freq_base(cfg.get("rope_theta", 10000.0))
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    if arch == "gemma3":
        w.add_sliding_window(cfg.get("sliding_window", 8))
    vocab = cfg["vocab_size"]
    w.add_tokenizer_model("gpt2")
    w.add_token_list([f"tok{i}" for i in range(vocab - 1)] + ["<|im_end|>"])
    w.add_token_types([1] * (vocab - 1) + [3])
    w.add_bos_token_id(0)
    w.add_eos_token_id(1)
    for hf, t in state.items():
        a = t.detach().float().numpy().copy()
        if arch == "llama" and ".self_attn.q_proj." in hf:
            a = llama_cpp_permute(a, heads)
        if arch == "llama" and ".self_attn.k_proj." in hf:
            a = llama_cpp_permute(a, kv)
        if arch == "gemma3" and hf.endswith("norm.weight"):
            a = a + 1.0
        name = gguf_name(arch, hf)
        if quant is not None and a.ndim == 2:
            w.add_tensor(name, gguf.quants.quantize(a, quant), raw_dtype=quant)
        else:
            w.add_tensor(name, np.ascontiguousarray(a, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def tiny_hf_model(model_type: str, seed: int = 0, **over):
    """(HF config dict, model) of a tiny random model with non-trivial norm weights."""
    import transformers

    common = dict(
        vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        bos_token_id=0, eos_token_id=1, pad_token_id=None, tie_word_embeddings=False,
    )
    common.update(over)
    if model_type == "llama":
        cfg, cls = transformers.LlamaConfig(**common), transformers.LlamaForCausalLM
    elif model_type == "qwen3":
        cfg, cls = transformers.Qwen3Config(head_dim=16, **common), transformers.Qwen3ForCausalLM
    elif model_type == "gemma3_text":
        cfg = transformers.Gemma3TextConfig(head_dim=16, query_pre_attn_scalar=16, sliding_window=8, **common)
        cls = transformers.Gemma3ForCausalLM
    else:
        raise ValueError(model_type)
    torch.manual_seed(seed)
    model = cls(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.5)  # norms too: exercise the gemma (1 + w) shift
    return cfg.to_dict(), model
