"""Bit-tight packing of small unsigned codes into bytes.

Every 8 codes of `bits` bits become exactly `bits` bytes (little-endian bit
order), so a row of n codes costs n * bits / 8 bytes for any width 1..8.
"""

from __future__ import annotations

import torch


def packed_len(n: int, bits: int) -> int:
    if n % 8:
        raise ValueError(f"bit packing needs a multiple of 8 codes per row, got {n}")
    return n * bits // 8


def _shifts(count: int, step: int, device: torch.device) -> torch.Tensor:
    return torch.arange(count, dtype=torch.int64, device=device) * step


def pack_bits(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """codes [..., n] integers in [0, 2**bits) -> uint8 [..., n * bits / 8]."""
    if not 1 <= bits <= 8:
        raise ValueError(f"bits must be in 1..8, got {bits}")
    n = codes.shape[-1]
    out_len = packed_len(n, bits)
    if bits == 8:
        return codes.to(torch.uint8)
    lead = codes.shape[:-1]
    c = codes.to(torch.int64).reshape(*lead, n // 8, 8)
    # 8 codes of `bits` bits -> one (8*bits)-bit word, at most 56 bits: fits int64 without sign games
    word = (c << _shifts(8, bits, c.device)).sum(-1, keepdim=True)  # [..., n/8, 1]
    by = (word >> _shifts(bits, 8, c.device)) & 0xFF  # [..., n/8, bits]
    return by.to(torch.uint8).reshape(*lead, out_len)


def unpack_bits(packed: torch.Tensor, bits: int, n: int) -> torch.Tensor:
    """uint8 [..., n * bits / 8] -> int64 codes [..., n]."""
    if bits == 8:
        return packed.to(torch.int64)
    lead = packed.shape[:-1]
    by = packed.to(torch.int64).reshape(*lead, n // 8, bits)
    word = (by << _shifts(bits, 8, by.device)).sum(-1, keepdim=True)  # [..., n/8, 1]
    c = (word >> _shifts(8, bits, by.device)) & ((1 << bits) - 1)  # [..., n/8, 8]
    return c.reshape(*lead, n)
