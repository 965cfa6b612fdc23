"""The identity codec: K/V stored in the model's compute dtype."""

from __future__ import annotations

import torch

from augury.kv.codecs.base import FieldSpec, SideCodec


class NativeCodec(SideCodec):
    @property
    def id(self) -> str:
        return "native"

    @property
    def is_native(self) -> bool:
        return True

    def fields(self, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> list[FieldSpec]:
        return [FieldSpec("x", (num_kv_heads, head_dim), dtype)]

    def encode(self, x: torch.Tensor, dtype: torch.dtype) -> list[torch.Tensor]:
        return [x.to(dtype)]

    def decode(self, parts: list[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
        return parts[0].to(dtype)
