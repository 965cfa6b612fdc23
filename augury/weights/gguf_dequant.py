"""Dequantize GGML tensor types to float32 torch tensors.

Each function mirrors the arithmetic order of `gguf.quants` (the reference)
so results are bit-identical, but runs in torch (multi-threaded, no Python
per-block work). Types without a torch path fall back to `gguf.quants`.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as T
from gguf import quants as gguf_quants


def _f16(b: torch.Tensor) -> torch.Tensor:
    """(n, 2) uint8 -> (n, 1) float32 from little-endian float16."""
    return b.contiguous().view(torch.float16).float()


def _nibbles(qs: torch.Tensor) -> torch.Tensor:
    """(..., k) uint8 -> (..., 2, k): low nibbles first, then high (ggml's order)."""
    return torch.stack([qs & 0x0F, qs >> 4], dim=-2)


def _bits(b: torch.Tensor, n: int) -> torch.Tensor:
    """(..., k) uint8 -> (..., n, k) where [..., j, :] is bit j of each byte."""
    shifts = torch.arange(n, dtype=torch.uint8).view(n, 1)
    return (b.unsqueeze(-2) >> shifts) & 1


def _q4_0(b: torch.Tensor) -> torch.Tensor:
    d = _f16(b[:, :2])
    q = _nibbles(b[:, 2:]).reshape(len(b), 32).float() - 8.0
    return d * q


def _q4_1(b: torch.Tensor) -> torch.Tensor:
    d, m = _f16(b[:, :2]), _f16(b[:, 2:4])
    q = _nibbles(b[:, 4:]).reshape(len(b), 32).float()
    return (d * q) + m


def _q5_high(qh: torch.Tensor) -> torch.Tensor:
    """(n, 4) uint8 (a little-endian uint32) -> (n, 32) bit j = 5th bit of element j."""
    return _bits(qh, 8).transpose(1, 2).reshape(len(qh), 32)


def _q5_0(b: torch.Tensor) -> torch.Tensor:
    d = _f16(b[:, :2])
    ql = _nibbles(b[:, 6:]).reshape(len(b), 32)
    q = (ql | (_q5_high(b[:, 2:6]) << 4)).float() - 16.0
    return d * q


def _q5_1(b: torch.Tensor) -> torch.Tensor:
    d, m = _f16(b[:, :2]), _f16(b[:, 2:4])
    ql = _nibbles(b[:, 8:]).reshape(len(b), 32)
    q = (ql | (_q5_high(b[:, 4:8]) << 4)).float()
    return (d * q) + m


def _q8_0(b: torch.Tensor) -> torch.Tensor:
    d = _f16(b[:, :2])
    x = b[:, 2:].contiguous().view(torch.int8).float()
    return x * d


def _k_scale_min(s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(n, 12) packed 6-bit scales/mins of Q4_K/Q5_K -> two (n, 8) float tensors."""
    s = s.reshape(len(s), 3, 4)
    d, m, md = s[:, 0], s[:, 1], s[:, 2]
    sc = torch.cat([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], dim=1)
    mn = torch.cat([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], dim=1)
    return sc.float(), mn.float()


def _q4_k(b: torch.Tensor) -> torch.Tensor:
    n = len(b)
    d, dmin = _f16(b[:, :2]), _f16(b[:, 2:4])
    sc, mn = _k_scale_min(b[:, 4:16])
    q = _nibbles(b[:, 16:].reshape(n, 4, 32)).reshape(n, 8, 32).float()
    return ((d * sc).unsqueeze(-1) * q - (dmin * mn).unsqueeze(-1)).reshape(n, 256)


def _q5_k(b: torch.Tensor) -> torch.Tensor:
    n = len(b)
    d, dmin = _f16(b[:, :2]), _f16(b[:, 2:4])
    sc, mn = _k_scale_min(b[:, 4:16])
    qh = _bits(b[:, 16:48], 8)  # (n, 8, 32): sub-block j takes bit j
    ql = _nibbles(b[:, 48:].reshape(n, 4, 32)).reshape(n, 8, 32)
    q = (ql | (qh << 4)).float()
    return ((d * sc).unsqueeze(-1) * q - (dmin * mn).unsqueeze(-1)).reshape(n, 256)


def _q6_k(b: torch.Tensor) -> torch.Tensor:
    n = len(b)
    ql = _nibbles(b[:, :128].reshape(n, 2, 64)).reshape(n, 8, 32)
    shifts = torch.tensor([0, 2, 4, 6], dtype=torch.uint8).view(4, 1)
    qh = ((b[:, 128:192].reshape(n, 2, 1, 32) >> shifts) & 3).reshape(n, 8, 32)
    q = ((ql | (qh << 4)).float() - 32.0).reshape(n, 16, 16)
    scales = b[:, 192:208].contiguous().view(torch.int8).float()
    d = _f16(b[:, 208:210])
    return ((d * scales).unsqueeze(-1) * q).reshape(n, 256)


_BLOCK_FNS: dict[T, Callable[[torch.Tensor], torch.Tensor]] = {
    T.Q4_0: _q4_0,
    T.Q4_1: _q4_1,
    T.Q5_0: _q5_0,
    T.Q5_1: _q5_1,
    T.Q8_0: _q8_0,
    T.Q4_K: _q4_k,
    T.Q5_K: _q5_k,
    T.Q6_K: _q6_k,
}
TORCH_TYPES = frozenset(_BLOCK_FNS) | {T.F32, T.F16, T.BF16}

# Blocks per torch call: bounds the int/float temporaries (~1 GB peak on big embeddings).
_CHUNK_BLOCKS = 1 << 18


def dequantize(raw: np.ndarray, qtype: T, shape: tuple[int, ...]) -> torch.Tensor:
    """raw: uint8 bytes of one tensor -> float32 tensor of `shape` (HF order)."""
    raw = np.ascontiguousarray(raw).reshape(-1)
    if qtype == T.F32:
        return torch.from_numpy(raw.view(np.float32).copy()).reshape(shape)
    if qtype == T.F16:
        return torch.from_numpy(raw.view(np.float16).copy()).float().reshape(shape)
    if qtype == T.BF16:
        return torch.from_numpy(raw.view(np.int16).copy()).view(torch.bfloat16).float().reshape(shape)
    fn = _BLOCK_FNS.get(qtype)
    block, type_size = GGML_QUANT_SIZES[qtype]
    if fn is None:
        rows = raw.reshape(-1, shape[-1] // block * type_size)
        return torch.from_numpy(np.ascontiguousarray(gguf_quants.dequantize(rows, qtype))).reshape(shape)
    blocks = torch.from_numpy(raw.copy()).view(-1, type_size)
    out = torch.empty(blocks.shape[0], block, dtype=torch.float32)
    for s in range(0, blocks.shape[0], _CHUNK_BLOCKS):
        out[s : s + _CHUNK_BLOCKS] = fn(blocks[s : s + _CHUNK_BLOCKS])
    return out.reshape(shape)
