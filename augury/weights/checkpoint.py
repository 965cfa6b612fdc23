"""The loader's product: one model's config, tokenizer source and a lazy tensor stream."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterator

import torch

if TYPE_CHECKING:
    from augury.config import ModelConfig

TensorStream = Callable[[], Iterator[tuple[str, torch.Tensor]]]


@dataclass
class Checkpoint:
    source: str  # resolved path (HF directory or .gguf file)
    kind: str  # "hf" | "gguf"
    config: dict[str, Any]  # HF config.json-style dict, accepted by ModelConfig.from_hf_dict
    # Yields (HF parameter name, float tensor in HF conventions); call again to re-read.
    tensors: TensorStream
    generation_config: dict[str, Any] = field(default_factory=dict)
    # {"kind": "hf_dir", "path": str} or {"kind": "gguf", "metadata": {tokenizer.* fields}}
    tokenizer_files: dict[str, Any] = field(default_factory=dict)
    fingerprint: str = ""  # stable identity of weights + config, for cache namespaces

    def model_config(self) -> "ModelConfig":
        from augury.config import ModelConfig

        return ModelConfig.from_hf_dict(self.config)

    def eos_token_ids(self) -> tuple[int, ...]:
        """Stop ids: config eos plus generation_config eos (chat models add end-of-turn there)."""
        ids: list[int] = []
        for src in (self.config.get("eos_token_id"), self.generation_config.get("eos_token_id")):
            for i in src if isinstance(src, (list, tuple)) else ([src] if src is not None else []):
                if int(i) not in ids:
                    ids.append(int(i))
        return tuple(ids)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Materialize every tensor (tests and small models; the engine streams instead)."""
        return dict(self.tensors())
