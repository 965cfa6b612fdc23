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


# The tensor-core GEMV's layout (`triton_gemv_w4m`): the weight in tiles of 16 rows x 256 columns
# (8 groups of 32), tiles ordered (column block, row tile), each tile 2 KB = [4 loads, 32 lanes,
# 4 words]: lane l = 4 g + t's word j = 4 c + jj is its A operand of the j-th m16n8k16 mma of the
# tile. Rows g and g + 8 of the tile, column groups t and t + 4, columns 2 j and 2 j + 1 of the group:
# nibble b holds row g + 8 ((b >> 1) & 1), group t + 4 (b & 1), column 2 j + (b >> 2), so one LOP3
# with 0x000F000F / 0x00F000F0 (on the word, then on it shifted by 8) yields each fp16x2 A register.
MMA_ROWS, MMA_COLS = 16, 256


def _mma_nibble_index(device) -> tuple[torch.Tensor, torch.Tensor]:
    """(row in tile, column in block) of every nibble: int64 [8 nibbles, 4 c, 32 lanes, 4 jj] each."""
    b = torch.arange(8, device=device)[:, None, None, None]
    c = torch.arange(4, device=device)[None, :, None, None]
    lane = torch.arange(32, device=device)[None, None, :, None]
    jj = torch.arange(4, device=device)[None, None, None, :]
    g, t, j = lane // 4, lane % 4, 4 * c + jj
    row = g + 8 * ((b >> 1) & 1)
    col = 32 * (t + 4 * (b & 1)) + 2 * j + (b >> 2)
    return row.expand(8, 4, 32, 4), col.expand(8, 4, 32, 4)


def pack_mma(q: torch.Tensor) -> torch.Tensor:
    """q [N, K] (values 0..15), N % 16 == 0, K % 256 == 0 -> int32 [K / 256, N / 16, 512] on q's device."""
    n, k = q.shape
    if n % MMA_ROWS or k % MMA_COLS:
        raise ValueError(f"the mma int4 layout needs N % {MMA_ROWS} == 0 and K % {MMA_COLS} == 0, got {n}x{k}")
    row, col = _mma_nibble_index(q.device)
    tiles = q.to(torch.int32).view(n // 16, 16, k // 256, 256).permute(2, 0, 1, 3)  # [KB, NT, 16, 256]
    nib = tiles[:, :, row, col]  # [KB, NT, 8, 4, 32, 4]
    words = torch.zeros(nib.shape[:2] + nib.shape[3:], dtype=torch.int64, device=q.device)
    for b in range(8):
        words |= nib[:, :, b].to(torch.int64) << (4 * b)
    words = torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)
    return words.reshape(k // 256, n // 16, 512)


def unpack_mma(packed: torch.Tensor) -> torch.Tensor:
    """The inverse of `pack_mma`: int32 [K / 256, N / 16, 512] -> q [N, K] uint8."""
    kb, nt, _ = packed.shape
    row, col = _mma_nibble_index(packed.device)
    words = packed.to(torch.int64).view(kb, nt, 4, 32, 4)
    tiles = torch.empty(kb, nt, 16, 256, dtype=torch.uint8, device=packed.device)
    for b in range(8):
        tiles[:, :, row[b], col[b]] = ((words >> (4 * b)) & 15).to(torch.uint8)
    return tiles.permute(1, 2, 0, 3).reshape(nt * 16, kb * 256)


def _mma_scale_index(device) -> tuple[torch.Tensor, torch.Tensor]:
    """(row in tile, group in block) of lane l's accumulator entry c of a tile: int64 [32, 4] each
    (m16n8k16's C fragment: c0/c1 row g, c2/c3 row g + 8; columns 2 t and 2 t + 1 = the groups)."""
    lane = torch.arange(32, device=device)[:, None]
    c = torch.arange(4, device=device)[None, :]
    return (lane // 4 + 8 * (c >> 1)).expand(32, 4), (2 * (lane % 4) + (c & 1)).expand(32, 4)


def scales_mma(scales: torch.Tensor) -> torch.Tensor:
    """int32 (scale, zero) pairs [N, K / 32] (`transpose_scales`) -> [K / 256, N / 16, 128] in the
    tiles' order, lane l's four entries (its accumulator's) one 16-byte load."""
    n, g = scales.shape
    if n % MMA_ROWS or g % 8:
        raise ValueError(f"the mma int4 layout needs N % 16 == 0 and K / 32 % 8 == 0, got [{n}, {g}] scales")
    row, grp = _mma_scale_index(scales.device)
    tiles = scales.view(n // 16, 16, g // 8, 8).permute(2, 0, 1, 3)  # [KB, NT, 16, 8]
    return tiles[:, :, row, grp].reshape(g // 8, n // 16, 128).contiguous()


def unscales_mma(sz: torch.Tensor) -> torch.Tensor:
    """The inverse of `scales_mma`."""
    kb, nt, _ = sz.shape
    row, grp = _mma_scale_index(sz.device)
    tiles = torch.empty(kb, nt, 16, 8, dtype=sz.dtype, device=sz.device)
    tiles[:, :, row, grp] = sz.view(kb, nt, 32, 4)
    return tiles.permute(1, 2, 0, 3).reshape(nt * 16, kb * 8)
