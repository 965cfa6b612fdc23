"""The KV codec seam: how one side (K or V) of a token is stored in the pool.

A `SideCodec` turns rows x [N, Hkv, D] into a fixed list of storage tensors
(each [N, ...], described by `fields`) and back. A codec may store vectors in
a rotated basis (`rotation`): `decode` then returns R x, attention rotates the
queries for keys (q·k is unchanged) and un-rotates the output for values (once
per query row, not per cached token). `KVCodec` pairs a key and a value codec
and names the pair for cache namespaces.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from augury.kv.codecs.hadamard import Rotation


class CodecError(ValueError):
    """A codec cannot be built or cannot take this model; the message says why."""


@dataclass(frozen=True)
class FieldSpec:
    name: str
    shape: tuple[int, ...]  # per token (slot)
    dtype: torch.dtype

    def nbytes(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n * torch.empty((), dtype=self.dtype).element_size()


class SideCodec(ABC):
    """Encodes one side (keys or values) of the KV cache."""

    rotation: Rotation | None = None

    @property
    @abstractmethod
    def id(self) -> str:
        """Stable name with every parameter that changes the stored bytes."""

    @abstractmethod
    def fields(self, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> list[FieldSpec]:
        """Storage tensors per token; `dtype` is the model's compute dtype."""

    @abstractmethod
    def encode(self, x: torch.Tensor, dtype: torch.dtype) -> list[torch.Tensor]:
        """x [N, Hkv, D] (any float dtype) -> storage tensors matching `fields`."""

    @abstractmethod
    def decode(self, parts: list[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
        """Storage tensors [..., *field shape] -> [..., Hkv, D] in `dtype`, in the rotated basis if any."""

    def check_head_dim(self, head_dim: int) -> None:
        """Raise CodecError when this codec cannot store vectors of `head_dim`."""

    def bind(self, head_dim: int) -> None:
        """Fix head_dim-dependent state (the rotation) before the first encode/decode."""

    def decode_full(self, parts: list[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
        """Like decode, but back in the original basis (tests, conversions)."""
        x = self.decode(parts, dtype)
        return x if self.rotation is None else self.rotation.unrotate(x)

    @property
    def is_native(self) -> bool:
        return False

    def bytes_per_token(self, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
        return sum(f.nbytes() for f in self.fields(num_kv_heads, head_dim, dtype))

    def bits_per_element(self, head_dim: int, dtype: torch.dtype) -> float:
        return 8.0 * self.bytes_per_token(1, head_dim, dtype) / head_dim


@dataclass(frozen=True)
class KVCodec:
    """A key codec and a value codec; `start` = tokens kept native before encoding begins."""

    key: SideCodec
    value: SideCodec
    start: int = 0
    name: str = ""  # short human name ("native", "affine4", "turbo-k8v3", ...)

    @property
    def id(self) -> str:
        base = "native" if self.is_native else f"k={self.key.id};v={self.value.id}"
        return base if self.start == 0 or self.is_native else f"{base};start={self.start}"

    @property
    def is_native(self) -> bool:
        return self.key.is_native and self.value.is_native

    def check_head_dim(self, head_dim: int) -> None:
        self.key.check_head_dim(head_dim)
        self.value.check_head_dim(head_dim)

    def bind(self, head_dim: int) -> None:
        self.check_head_dim(head_dim)
        self.key.bind(head_dim)
        self.value.bind(head_dim)

    def bytes_per_token_per_layer(self, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
        return (self.key.bytes_per_token(num_kv_heads, head_dim, dtype)
                + self.value.bytes_per_token(num_kv_heads, head_dim, dtype))

    def bits_per_element(self, head_dim: int, dtype: torch.dtype) -> float:
        """Mean stored bits per K/V element, scales and zeros included."""
        return 0.5 * (self.key.bits_per_element(head_dim, dtype) + self.value.bits_per_element(head_dim, dtype))
