"""Token embedding with an optional constant scale (Gemma multiplies by sqrt(hidden))."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class ScaledEmbedding(nn.Module):
    def __init__(
        self,
        vocab_size: int,
        hidden_size: int,
        scale: float | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(vocab_size, hidden_size, device=device, dtype=dtype))
        # HF rounds the scale to the compute dtype first (sqrt(3072) -> 55.5 in bf16)
        self.scale = None if scale is None else torch.tensor(scale, device="cpu").to(self.weight.dtype).item()

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """input_ids [T] -> [T, hidden] in the weight dtype."""
        h = F.embedding(input_ids, self.weight)
        if self.scale is None:
            return h
        return h * self.scale
