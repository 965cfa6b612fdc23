"""Group-wise affine integer codec (mlx-lm style): per group of `group_size`
coordinates along head_dim, x ≈ zero + scale * q with q in [0, 2**bits).

Scale and zero are stored in float16; codes are computed against the rounded
scale/zero so decode reproduces exactly what encode intended. With `rotate`,
vectors are first turned by a randomized Hadamard transform (rotated keys).
"""

from __future__ import annotations

import torch

from augury.kv.codecs.base import CodecError, FieldSpec, SideCodec
from augury.kv.codecs.hadamard import Rotation, is_power_of_two
from augury.kv.codecs.packing import pack_bits, unpack_bits

_FP16_TINY = 6.2e-5  # smallest normal float16: keeps constant groups from a zero scale


class AffineCodec(SideCodec):
    def __init__(self, bits: int, group_size: int = 64, rotate: bool = False, seed: int = 0x6B):
        if not 2 <= bits <= 8:
            raise CodecError(f"affine KV bits must be in 2..8, got {bits}")
        if group_size < 8 or group_size % 8:
            raise CodecError(f"affine KV group size must be a multiple of 8, got {group_size}")
        self.bits, self.group_size, self.rotate, self.seed = bits, group_size, rotate, seed
        self.rotation: Rotation | None = None

    @property
    def id(self) -> str:
        rot = f"-rot{self.seed}" if self.rotate else ""
        return f"affine{self.bits}g{self.group_size}{rot}"

    def check_head_dim(self, head_dim: int) -> None:
        if head_dim % self.group_size:
            raise CodecError(f"affine KV group size {self.group_size} does not divide head_dim {head_dim}; "
                             f"choose --kv-group-size among the divisors of {head_dim}")
        if self.rotate and not is_power_of_two(head_dim):
            raise CodecError(f"rotated keys need a power-of-two head_dim, this model has {head_dim}")

    def bind(self, head_dim: int) -> None:
        """Fix the rotation for this head size (called before encode/decode)."""
        if self.rotate and self.rotation is None:
            self.check_head_dim(head_dim)
            self.rotation = Rotation(head_dim, self.seed)

    def fields(self, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> list[FieldSpec]:
        g = head_dim // self.group_size
        return [
            FieldSpec("codes", (num_kv_heads, head_dim * self.bits // 8), torch.uint8),
            FieldSpec("scale", (num_kv_heads, g), torch.float16),
            FieldSpec("zero", (num_kv_heads, g), torch.float16),
        ]

    def encode(self, x: torch.Tensor, dtype: torch.dtype) -> list[torch.Tensor]:
        D = x.shape[-1]
        self.bind(D)
        x = x.float()
        if self.rotation is not None:
            x = self.rotation.rotate(x)
        lead = x.shape[:-1]
        xg = x.reshape(*lead, D // self.group_size, self.group_size)
        lo, hi = xg.amin(-1), xg.amax(-1)
        levels = (1 << self.bits) - 1
        scale = ((hi - lo) / levels).clamp_min(_FP16_TINY).half()
        zero = lo.half()
        q = torch.round((xg - zero.float()[..., None]) / scale.float()[..., None]).clamp_(0, levels)
        return [pack_bits(q.reshape(*lead, D), self.bits), scale, zero]

    def decode(self, parts: list[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
        codes, scale, zero = parts
        D = codes.shape[-1] * 8 // self.bits
        self.bind(D)
        lead = codes.shape[:-1]
        q = unpack_bits(codes, self.bits, D).view(*lead, D // self.group_size, self.group_size)
        x = q.to(torch.float32) * scale.float()[..., None] + zero.float()[..., None]
        return x.view(*lead, D).to(dtype)
