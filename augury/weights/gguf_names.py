"""GGUF tensor names (llama.cpp) -> Hugging Face parameter names, per architecture."""

from __future__ import annotations

import re

from .errors import WeightsError

_TOP: dict[str, str] = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}

_LAYER_COMMON: dict[str, str] = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}

# Where the arch's layer norms land: llama.cpp's "ffn_norm" is the pre-MLP norm in
# every arch, but HF calls it post_attention_layernorm unless the model has sandwich norms.
_LAYER_ARCH: dict[str, dict[str, str]] = {
    "llama": {"ffn_norm": "post_attention_layernorm"},
    "qwen2": {"ffn_norm": "post_attention_layernorm"},
    "qwen3": {"ffn_norm": "post_attention_layernorm"},
    "gemma3": {
        "ffn_norm": "pre_feedforward_layernorm",
        "post_attention_norm": "post_attention_layernorm",
        "post_ffw_norm": "post_feedforward_layernorm",
    },
}

SUPPORTED_ARCHES = tuple(_LAYER_ARCH)

# Tensors llama.cpp derives from config (llama3 rope frequencies); HF has no parameter for them.
_DERIVED = {"rope_freqs.weight"}

_BLK = re.compile(r"^blk\.(\d+)\.([a-z0-9_]+)\.(weight|bias)$")


def hf_name(arch: str, gguf_name: str) -> str | None:
    """HF parameter name, or None for tensors HF does not store (derived)."""
    if arch not in _LAYER_ARCH:
        raise WeightsError(
            f"GGUF architecture {arch!r} is not supported; supported: {', '.join(SUPPORTED_ARCHES)}"
        )
    if gguf_name in _DERIVED:
        return None
    if gguf_name in _TOP:
        return _TOP[gguf_name]
    m = _BLK.match(gguf_name)
    part = m and (_LAYER_ARCH[arch].get(m.group(2)) or _LAYER_COMMON.get(m.group(2)))
    if not m or not part:
        raise WeightsError(f"GGUF tensor {gguf_name!r} has no known HF name for arch {arch!r}")
    return f"model.layers.{m.group(1)}.{part}.{m.group(3)}"
