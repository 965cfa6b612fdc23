"""Rotary position embeddings: inverse frequencies per rope type, a cos/sin
cache built once, and the rotation applied to flat [T, heads, D] tensors.

The cache stores `sin` with the rotate-half sign folded in, so that applying
rope is `x * cos + roll(x, D/2) * sin_signed` — four ops, exact vs HF's
`x * cos + rotate_half(x) * sin` (negation commutes with the product).
"""

from __future__ import annotations

import math

import torch

from augury.config import ConfigError, RopeConfig
from augury.layers import row_ops


def rope_inv_freq(rope: RopeConfig, head_dim: int) -> torch.Tensor:
    """[head_dim/2] float32 inverse frequencies, as HF's rope init functions compute them."""
    exps = torch.arange(0, head_dim, 2, dtype=torch.int64).to(torch.float32) / head_dim
    inv_freq = 1.0 / (rope.theta ** exps)
    if rope.rope_type in ("default", "dynamic"):
        # dynamic NTK only changes frequencies past the original context; treated as default
        return inv_freq
    if rope.rope_type == "linear":
        return inv_freq / rope.factor
    if rope.rope_type == "llama3":
        return _llama3_inv_freq(inv_freq, rope)
    raise ConfigError(
        f"rope_type {rope.rope_type!r} is not supported; supported: default, linear, llama3, dynamic"
    )


def _llama3_inv_freq(inv_freq: torch.Tensor, rope: RopeConfig) -> torch.Tensor:
    # Llama 3.1: long wavelengths divided by `factor`, short kept, the band between smoothly blended
    old_ctx = rope.original_max_position_embeddings
    low_wavelen = old_ctx / rope.low_freq_factor
    high_wavelen = old_ctx / rope.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / rope.factor, inv_freq)
    smooth = (old_ctx / wavelen - rope.low_freq_factor) / (rope.high_freq_factor - rope.low_freq_factor)
    smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


def rope_cos_sin_table(
    rope: RopeConfig, head_dim: int, max_positions: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin_signed: [max_positions, head_dim] float32 (sin's first half negated)."""
    inv_freq = rope_inv_freq(rope, head_dim)
    pos = torch.arange(max_positions, dtype=torch.int64).to(torch.float32)
    freqs = pos[:, None] * inv_freq[None, :]  # [P, D/2]; same products HF's matmul forms
    cos = freqs.cos()
    sin = freqs.sin()
    return torch.cat((cos, cos), dim=-1), torch.cat((-sin, sin), dim=-1)


class RotaryEmbedding(torch.nn.Module):
    """Holds the cos/sin cache in the compute dtype (HF computes in fp32, then casts)."""

    def __init__(
        self,
        rope: RopeConfig,
        head_dim: int,
        max_positions: int,
        device: torch.device | str | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        self.rope = rope
        self.head_dim = head_dim
        self.max_positions = max_positions
        cos, sin = rope_cos_sin_table(rope, head_dim, max_positions)
        self.register_buffer("cos", cos.to(device=device, dtype=dtype), persistent=False)
        self.register_buffer("sin", sin.to(device=device, dtype=dtype), persistent=False)

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [T] -> (cos, sin_signed) each [T, 1, D], broadcast over heads."""
        return self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, n, D], cos/sin_signed [T, 1, D] -> rotated [T, n, D] (non-interleaved halves, HF layout)."""
    if (r := row_ops.rope(x, cos, sin)) is not None:
        return r  # one launch on the GPU (bitwise the ops below)
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * sin
