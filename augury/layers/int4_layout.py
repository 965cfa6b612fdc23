"""Tinygemm's packed int4 weight layout, written out in pure torch (no CUDA needed).

`Int4Linear` on CUDA stores its weight as torch's `_convert_weight_to_int4pack` leaves it,
the operand layout of tinygemm's m16n8k16 tensor-core kernel. The one-row int4 product in
`augury.layers.triton_gemv` reads those same bytes, so an int4 model keeps one copy of its
weights. This module is the layout's specification: `pack` builds it on any device (tests
run the kernel on it under the Triton interpreter) and a CUDA test checks it equals torch's
converter bit for bit.

The packed tensor is int32 [N / 8, K / (16 T), 32, T / 2] for T = inner k-tiles (2, 4 or 8):
- one block [32, T / 2] per (8-row tile, super-tile of 16 T columns); lane l of the block
  serves row 8 * tile + l // 4, and r = l % 4 picks its columns, so each row's 2 T words of
  a super-tile are contiguous (64 bytes at T = 8);
- word w of lane l covers the two 16-column k-tiles 2w and 2w + 1 of the super-tile: with
  c0 = 16 T * super + 32 w, nibble b (bits 4b..4b+3) holds column
  c0 + 2 r + (b >> 2) + 8 (b & 3). All 8 columns lie in [c0, c0 + 32): with groups of 32 or
  more columns one word needs one (scale, zero).
"""

from __future__ import annotations

import torch

INNER_K_TILES = (2, 4, 8)


def column_offsets(inner_k_tiles: int) -> torch.Tensor:
    """int64 [2 T, 8]: the column of nibble b of a row's word j in a super-tile, relative to the
    super-tile's first column. Word j of the row's 2 T contiguous words is word w = j % (T / 2)
    of lane r = j // (T / 2)."""
    half = inner_k_tiles // 2
    j = torch.arange(2 * inner_k_tiles)
    r, w = j // half, j % half
    b = torch.arange(8)
    return (32 * w + 2 * r)[:, None] + (b >> 2)[None, :] + 8 * (b & 3)[None, :]


def pack(q: torch.Tensor, inner_k_tiles: int) -> torch.Tensor:
    """q [N, K] (values 0..15), N % 8 == 0 and K % (16 T) == 0 -> tinygemm's int32 layout, on q's device."""
    if inner_k_tiles not in INNER_K_TILES:
        raise ValueError(f"inner_k_tiles must be one of {INNER_K_TILES}, got {inner_k_tiles}")
    n, k = q.shape
    span = 16 * inner_k_tiles
    if n % 8 or k % span:
        raise ValueError(f"tinygemm layout needs N % 8 == 0 and K % {span} == 0, got {n}x{k}")
    cols = column_offsets(inner_k_tiles).to(q.device)  # [2T, 8]
    sup = torch.arange(k // span, device=q.device)[:, None, None] * span + cols  # [S, 2T, 8]
    nib = q.to(torch.int64)[:, sup]  # [N, S, 2T, 8]
    words = (nib << (4 * torch.arange(8, device=q.device))).sum(-1)  # < 2^32
    words = torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)  # [N, S, 2T]
    # rows n = 8 t + l // 4 with lane l = 4 (n % 8) + r: [N/8, 8, S, 4, T/2] -> [N/8, S, 8, 4, T/2]
    words = words.view(n // 8, 8, k // span, 4, inner_k_tiles // 2).permute(0, 2, 1, 3, 4)
    return words.reshape(n // 8, k // span, 32, inner_k_tiles // 2).contiguous()


def transpose_scales(scales_zeros: torch.Tensor) -> torch.Tensor:
    """tinygemm's bf16 (scale, zero) pairs [G, N, 2] -> the same pairs as int32 [N, G] (the one-row
    GEMV's order: a row's consecutive groups are one vector load)."""
    return scales_zeros.view(torch.int32)[..., 0].T.contiguous()


def unpack(packed: torch.Tensor) -> torch.Tensor:
    """The inverse of `pack`: tinygemm's int32 layout -> q [N, K] uint8."""
    nt, s, _, half = packed.shape
    t = 2 * half
    w = packed.to(torch.int64).view(nt, s, 8, 4, half).permute(0, 2, 1, 3, 4).reshape(nt * 8, s, 2 * t)
    nib = (w[..., None] >> (4 * torch.arange(8, device=packed.device))) & 15  # [N, S, 2T, 8]
    cols = (torch.arange(s, device=packed.device)[:, None, None] * 16 * t
            + column_offsets(t).to(packed.device)).reshape(-1)
    q = torch.empty(nt * 8, s * 16 * t, dtype=torch.uint8, device=packed.device)
    q[:, cols] = nib.reshape(nt * 8, -1).to(torch.uint8)
    return q


# The one-row GEMV's own layout (`triton_gemv_w4r`): row-major int32 [N, K / 8], word j of a row
# holding columns 8j..8j+7, nibble b (bits 4b..4b+3) column 8j + ROWS_ORDER[b]: the nibble pairs
# (b, b + 4) that one LOP3 turns into an fp16x2 register are adjacent columns (2m, 2m + 1).
ROWS_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)


def pack_rows(q: torch.Tensor) -> torch.Tensor:
    """q [N, K] (values 0..15), K % 8 == 0 -> the row-major GEMV layout int32 [N, K / 8], on q's device."""
    n, k = q.shape
    if k % 8:
        raise ValueError(f"the row-major int4 layout needs K % 8 == 0, got {n}x{k}")
    nib = q.to(torch.int64).view(n, k // 8, 8)[..., list(ROWS_ORDER)]  # nibble b <- column ROWS_ORDER[b]
    words = (nib << (4 * torch.arange(8, device=q.device))).sum(-1)
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def unpack_rows(packed: torch.Tensor) -> torch.Tensor:
    """The inverse of `pack_rows`: int32 [N, K / 8] -> q [N, K] uint8."""
    n, kw = packed.shape
    nib = (packed.to(torch.int64)[..., None] >> (4 * torch.arange(8, device=packed.device))) & 15  # [N, KW, 8]
    q = torch.empty(n, kw, 8, dtype=torch.uint8, device=packed.device)
    q[..., list(ROWS_ORDER)] = nib.to(torch.uint8)
    return q.view(n, kw * 8)


BLOCK_ROWS = 16  # rows per contiguous tile of the blocked GEMV layout


def block_rows(packed: torch.Tensor, scales: torch.Tensor, entries: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The row-major layout [N, K / 8] and its int32 scales [N, G] (group 32) -> tile-major copies
    (same shapes): every tile of BLOCK_ROWS rows x 32 * entries columns contiguous, tiles ordered
    (row block, K slice), a tile's scales likewise. The GEMV (`triton_gemv_w4r`, its `entries`)
    then reads each row tile of a K slice as whole 2-4 KB runs instead of 128-byte pieces of rows
    2-7 KB apart (H200: the LM head 109 -> 97 us)."""
    n, kw = packed.shape
    ks = 4 * entries  # words per row of a tile
    if n % BLOCK_ROWS or kw % ks or scales.shape != (n, kw // 4):
        raise ValueError(f"block_rows: [{n}, {kw}] words do not split into {BLOCK_ROWS} x {ks}-word tiles "
                         f"(group 32 scales [{n}, {kw // 4}] only)")
    r = BLOCK_ROWS
    w = packed.view(n // r, r, kw // ks, ks).permute(0, 2, 1, 3).contiguous().view(n, kw)
    s = scales.view(n // r, r, kw // ks, entries).permute(0, 2, 1, 3).contiguous().view(n, kw // 4)
    return w, s


def unblock_rows(packed: torch.Tensor, scales: torch.Tensor, entries: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The inverse of `block_rows`."""
    n, kw = packed.shape
    ks, r = 4 * entries, BLOCK_ROWS
    w = packed.view(n // r, kw // ks, r, ks).permute(0, 2, 1, 3).contiguous().view(n, kw)
    s = scales.view(n // r, kw // ks, r, entries).permute(0, 2, 1, 3).contiguous().view(n, kw // 4)
    return w, s
