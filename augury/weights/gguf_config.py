"""GGUF metadata -> HF config.json-style dict, generation config and tokenizer fields."""

from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np

from .errors import WeightsError
from .gguf_names import SUPPORTED_ARCHES

_HF_MODEL_TYPE = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "gemma3": "gemma3_text"}
_HF_ARCHITECTURE = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "gemma3": "Gemma3ForCausalLM",
}
# Chat-turn terminators that llama.cpp also treats as end-of-generation.
_END_OF_TURN = ("<|im_end|>", "<end_of_turn>", "<|eot_id|>", "<|eom_id|>", "<|end|>", "<|endoftext|>")
_CONTROL_TOKEN = 3  # llama.cpp token_type for control tokens


def _uniform(value: Any, key: str) -> Any:
    """Some GGUFs store per-layer arrays (e.g. head_count_kv); we need one value."""
    if isinstance(value, list):
        if len(set(value)) != 1:
            raise WeightsError(f"GGUF {key} varies per layer ({value}); augury needs a uniform value")
        return value[0]
    return value


def config_from_metadata(
    meta: dict[str, Any], vocab_rows: int, has_output: bool, rope_freqs: np.ndarray | None = None
) -> dict[str, Any]:
    """HF-style config dict. vocab_rows: rows of token_embd; has_output: output.weight present."""
    arch = meta.get("general.architecture")
    if arch not in SUPPORTED_ARCHES:
        raise WeightsError(
            f"GGUF architecture {arch!r} is not supported; supported: {', '.join(SUPPORTED_ARCHES)}"
        )

    def get(key: str, default: Any = None, required: bool = False) -> Any:
        full = f"{arch}.{key}"
        if full not in meta:
            if required:
                raise WeightsError(f"GGUF metadata is missing {full}")
            return default
        return _uniform(meta[full], full)

    hidden = int(get("embedding_length", required=True))
    heads = int(get("attention.head_count", required=True))
    layers = int(get("block_count", required=True))
    head_dim = int(get("attention.key_length", hidden // heads))
    theta = float(get("rope.freq_base", 10000.0 if arch != "gemma3" else 1_000_000.0))
    cfg: dict[str, Any] = {
        "model_type": _HF_MODEL_TYPE[arch],
        "architectures": [_HF_ARCHITECTURE[arch]],
        "vocab_size": int(vocab_rows),
        "hidden_size": hidden,
        "intermediate_size": int(get("feed_forward_length", required=True)),
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": int(get("attention.head_count_kv", heads)),
        "head_dim": head_dim,
        "rms_norm_eps": float(get("attention.layer_norm_rms_epsilon", 1e-6)),
        "rope_theta": theta,
        "max_position_embeddings": int(get("context_length", 8192)),
        "tie_word_embeddings": not has_output,
        "bos_token_id": meta.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": meta.get("tokenizer.ggml.eos_token_id"),
        "pad_token_id": meta.get("tokenizer.ggml.padding_token_id"),
        "torch_dtype": "float32",
    }
    scaling = _rope_scaling(get, cfg["max_position_embeddings"])
    if arch == "llama" and rope_freqs is not None:
        scaling = llama3_rope_from_freqs(rope_freqs, head_dim, theta)
    if scaling:
        cfg["rope_scaling"] = scaling
    if arch == "llama":
        cfg.update(hidden_act="silu", attention_bias=False, mlp_bias=False)
    elif arch == "qwen2":
        cfg.update(hidden_act="silu", attention_bias=True, use_sliding_window=False)
    elif arch == "qwen3":
        cfg.update(hidden_act="silu", attention_bias=False, use_sliding_window=False)
    elif arch == "gemma3":
        cfg.update(_gemma3_extras(get, hidden, heads, layers, head_dim))
    return cfg


def _rope_scaling(get: Any, ctx: int) -> dict[str, Any] | None:
    kind = get("rope.scaling.type")
    factor = get("rope.scaling.factor")
    if kind in (None, "none") or not factor or float(factor) == 1.0:
        return None
    out: dict[str, Any] = {"rope_type": str(kind), "factor": float(factor)}
    orig = get("rope.scaling.original_context_length")
    if orig:
        out["original_max_position_embeddings"] = int(orig)
    return out


def _gemma3_extras(get: Any, hidden: int, heads: int, layers: int, head_dim: int) -> dict[str, Any]:
    pattern = 6  # llama.cpp: every 6th layer is global (sliding-window pattern of Gemma 3)
    # llama.cpp scales queries by 1/sqrt(head_dim) except for the 27B shape, which uses
    # hidden/heads (HF's query_pre_attn_scalar=168 there).
    scalar = hidden // heads if layers == 62 else head_dim
    return {
        "hidden_activation": "gelu_pytorch_tanh",
        "query_pre_attn_scalar": scalar,
        "sliding_window": int(get("attention.sliding_window", 4096)),
        "sliding_window_pattern": pattern,
        "layer_types": [
            "full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(layers)
        ],
        "rope_local_base_freq": 10000.0,
        "final_logit_softcapping": get("final_logit_softcapping"),
        "attn_logit_softcapping": get("attn_logit_softcapping"),
        "attention_bias": False,
    }


def llama3_rope_from_freqs(freqs: np.ndarray, head_dim: int, theta: float) -> dict[str, Any]:
    """Recover HF llama3 rope_scaling from llama.cpp's baked `rope_freqs` divisors.

    Llama 3.x all use low/high freq factors 1/4 over an 8192 original context; the
    factor is the largest divisor. We recompute the divisors and warn if they differ.
    """
    freqs = np.asarray(freqs, dtype=np.float64).reshape(-1)
    params = {
        "rope_type": "llama3",
        "factor": float(freqs.max()),
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }
    expect = _llama3_divisors(head_dim, theta, params)
    if expect.shape != freqs.shape or not np.allclose(expect, freqs, rtol=1e-3):
        warnings.warn("GGUF rope_freqs do not match llama3 rope scaling; long-context positions may drift")
    return params


def _llama3_divisors(head_dim: int, theta: float, p: dict[str, Any]) -> np.ndarray:
    inv = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    wavelen = 2 * math.pi / inv
    orig, lo, hi, factor = (
        p["original_max_position_embeddings"],
        p["low_freq_factor"],
        p["high_freq_factor"],
        p["factor"],
    )
    smooth = (orig / wavelen - lo) / (hi - lo)
    mid = 1.0 / ((1 - smooth) / factor + smooth)
    return np.where(wavelen < orig / hi, 1.0, np.where(wavelen > orig / lo, factor, mid))


def tokenizer_metadata(meta: dict[str, Any]) -> dict[str, Any]:
    """All tokenizer.* fields, as plain Python values."""
    return {k: v for k, v in meta.items() if k.startswith("tokenizer.")}


def generation_config(meta: dict[str, Any]) -> dict[str, Any]:
    """HF-style generation config: eos plus the vocabulary's end-of-turn control tokens.

    GGUF stores a single eos id; chat models also stop on their turn terminator
    (Gemma's <end_of_turn>, Llama 3's <|eot_id|>), as their HF generation_config does.
    """
    eos = meta.get("tokenizer.ggml.eos_token_id")
    stops: list[int] = [] if eos is None else [int(eos)]
    for key in ("tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"):
        if meta.get(key) is not None and int(meta[key]) not in stops:
            stops.append(int(meta[key]))
    tokens: list[str] = meta.get("tokenizer.ggml.tokens") or []
    types: list[int] = meta.get("tokenizer.ggml.token_type") or []
    wanted = set(_END_OF_TURN)
    for i, tok in enumerate(tokens):
        if tok in wanted and (not types or types[i] == _CONTROL_TOKEN) and i not in stops:
            stops.append(i)
    out: dict[str, Any] = {"eos_token_id": stops}
    for src, dst in (("bos_token_id", "bos_token_id"), ("padding_token_id", "pad_token_id")):
        if meta.get(f"tokenizer.ggml.{src}") is not None:
            out[dst] = int(meta[f"tokenizer.ggml.{src}"])
    return out
