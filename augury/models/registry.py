"""model_type -> model class, and the one way to build a model."""

from __future__ import annotations

import torch

from augury.config import ConfigError, ModelConfig
from augury.models.base import CausalLM
from augury.models.gemma3 import Gemma3ForCausalLM
from augury.models.llama import LlamaForCausalLM
from augury.models.qwen2 import Qwen2ForCausalLM
from augury.models.qwen3 import Qwen3ForCausalLM

MODEL_CLASSES: dict[str, type[CausalLM]] = {
    "llama": LlamaForCausalLM,
    "qwen2": Qwen2ForCausalLM,
    "qwen3": Qwen3ForCausalLM,
    "gemma3_text": Gemma3ForCausalLM,
}


def build_model(
    cfg: ModelConfig,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    max_positions: int | None = None,
) -> CausalLM:
    """An uninitialized model (fill it with `load_weights` or `randomize_weights`).

    Parameters are allocated without running init kernels (meta, then to_empty);
    `max_positions` bounds the rope cache (default: cfg.max_position_embeddings).
    """
    cls = MODEL_CLASSES.get(cfg.model_type)
    if cls is None:
        raise ConfigError(f"no model for model_type {cfg.model_type!r}; have: {', '.join(MODEL_CLASSES)}")
    if dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise ConfigError(f"compute dtype must be float32, bfloat16 or float16, got {dtype}")
    with torch.device("meta"):
        model = cls(cfg, dtype=dtype)
    model = model.to_empty(device=device)
    if cfg.tie_word_embeddings:
        model.tie_weights()  # to_empty may allocate the shared parameter twice
    model.init_rope(max_positions)
    return model.eval().requires_grad_(False)
