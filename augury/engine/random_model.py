"""Random-weight models of a named shape, for throughput benchmarks (no tokenizer).

Speed does not depend on weight values, so an 8B-shaped model with random bf16
weights measures the same step time as the real one without a download.
"""

from __future__ import annotations

import hashlib
import json


from augury.config import EngineConfig, ModelConfig
from augury.engine.loader import LoadedModel, pick_device, pick_dtype

SHAPES: dict[str, dict] = {
    "llama3-8b": dict(model_type="llama", vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                      num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                      max_position_embeddings=8192, rope_theta=500000.0, rms_norm_eps=1e-5),
    "smollm2-135m": dict(model_type="llama", vocab_size=49152, hidden_size=576, intermediate_size=1536,
                         num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                         max_position_embeddings=8192, rope_theta=100000.0, rms_norm_eps=1e-5,
                         tie_word_embeddings=True),
    "gemma3-270m": dict(model_type="gemma3_text", vocab_size=262144, hidden_size=640, intermediate_size=2048,
                        num_hidden_layers=18, num_attention_heads=4, num_key_value_heads=1, head_dim=256,
                        max_position_embeddings=32768, sliding_window=512, query_pre_attn_scalar=256,
                        rope_theta=1000000.0, rope_local_base_freq=10000.0, rms_norm_eps=1e-6),
}


class NullTokenizer:
    """Stands in for a tokenizer when requests are token ids only (no text out)."""

    is_null = True
    fingerprint = "none"
    eos_token_ids: list[int] = []
    bos_token_id = None

    def __init__(self, vocab_size: int):
        self.vocab_size = vocab_size

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        raise ValueError("this random-weight model has no tokenizer: submit token ids")


def load_random(shape: str | dict, config: EngineConfig) -> LoadedModel:
    from augury.models.registry import build_model

    d = SHAPES[shape] if isinstance(shape, str) else shape
    mcfg = ModelConfig.from_hf_dict(d)
    device = pick_device(config.device)
    dtype = pick_dtype(config.dtype, device)
    model = build_model(mcfg, device, dtype, max_positions=config.max_model_len)
    model.randomize_weights(seed=0)
    if config.weights != "native":
        from augury.weights.quantize import quantize_model

        quantize_model(model, config.weights)
    model.eval()
    from augury.engine.loader import maybe_compile

    maybe_compile(model, config)
    fp = hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]
    name = shape if isinstance(shape, str) else "random"
    return LoadedModel(name, model, mcfg, NullTokenizer(mcfg.vocab_size), device, dtype, f"random-{fp}", [], {})
