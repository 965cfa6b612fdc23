"""The loader's product: one model's config, tokenizer source and a lazy tensor stream."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch

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

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Materialize every tensor (tests and small models; the engine streams instead)."""
        return dict(self.tensors())
