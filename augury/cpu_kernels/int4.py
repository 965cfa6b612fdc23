"""The native int4 x int8 matmul (int4_gemm.cpp): weight packing (pure torch) and the call."""

from __future__ import annotations

import torch

TILE, BLOCK = 16, 32  # output rows per tile, input columns per activation block (int4_gemm.cpp)


def pack_nibbles(q: torch.Tensor) -> torch.Tensor:
    """q [N, K] (0..15) -> packed [N/16, K/32, 256] uint8 (layout: int4_gemm.cpp's header).

    N must be a multiple of 16 and K of 32 (Int4Linear pads both)."""
    n, k = q.shape
    if n % TILE or k % BLOCK:
        raise ValueError(f"int4 CPU kernel needs N % {TILE} == 0 and K % {BLOCK} == 0, got {n}x{k}")
    t, b = n // TILE, k // BLOCK
    # [tile, lane j, block, quad, r] -> [tile, block, quad, lane j, r]
    q5 = q.to(torch.uint8).reshape(t, TILE, b, 8, 4).permute(0, 2, 3, 1, 4)
    return (q5[:, :, 0::2] | (q5[:, :, 1::2] << 4)).reshape(t, b, TILE * BLOCK // 2).contiguous()


def pack_scales(scale: torch.Tensor, zero: torch.Tensor) -> torch.Tensor:
    """scale/zero [N, G] -> [N/16, G, 2, 16] bf16: per tile and group, the 16 rows' scales then zeros."""
    n, g = scale.shape
    sz = torch.stack((scale.float().reshape(n // TILE, TILE, g), zero.float().reshape(n // TILE, TILE, g)), dim=2)
    return sz.permute(0, 3, 2, 1).to(torch.bfloat16).contiguous()


def pack_int4(q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """q [N, K] (0..15), scale/zero [N, G] -> (packed, scales) for `int4_mm`."""
    return pack_nibbles(q), pack_scales(scale, zero)


def int4_mm(x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, group_size: int) -> torch.Tensor:
    """x [M, K] float32 -> [M, N] float32 (activations quantized to int8 per 32 columns)."""
    return torch.ops.augury_cpu.int4_mm(x, packed, scales, group_size)
