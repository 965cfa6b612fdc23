"""TurboQuant-style codebook codec: randomized Hadamard rotation, per-group
RMS scale, Lloyd-Max codebook of a unit normal, bit-tight codes.

After the rotation every coordinate of a head vector is close to normal with
the same spread, so one RMS per group of 32 plus a fixed normal codebook is
near-optimal in MSE for its bits. Decode returns the rotated vector; for values
attention un-rotates its output once per query row.
"""

from __future__ import annotations

import torch

from augury.kv.codecs._tables import CENTROIDS
from augury.kv.codecs.base import CodecError, FieldSpec, SideCodec
from augury.kv.codecs.hadamard import Rotation, is_power_of_two
from augury.kv.codecs.packing import pack_bits, unpack_bits

CODEBOOK_BITS = (2, 3, 4, 5, 8)


def codebook(bits: int) -> torch.Tensor:
    """[2**bits] float32 Lloyd-Max centroids of N(0, 1), ascending."""
    if bits not in CENTROIDS:
        raise CodecError(f"no Lloyd-Max codebook for {bits} bits (have {sorted(CENTROIDS)})")
    return torch.tensor(CENTROIDS[bits], dtype=torch.float32)


def codebook_boundaries(bits: int) -> torch.Tensor:
    c = codebook(bits)
    return 0.5 * (c[1:] + c[:-1])


def quantize_normal(z: torch.Tensor, bits: int) -> torch.Tensor:
    """z float -> int64 index of the nearest centroid (cells split at midpoints)."""
    return torch.bucketize(z.contiguous(), codebook_boundaries(bits).to(z.device))


class TurboCodec(SideCodec):
    def __init__(self, bits: int, group_size: int = 32, seed: int = 0x76):
        if bits not in CODEBOOK_BITS:
            raise CodecError(f"turbo codebook bits must be one of {CODEBOOK_BITS}, got {bits}")
        self.bits, self.group_size, self.seed = bits, group_size, seed
        self.rotation: Rotation | None = None
        self._centroids: dict = {}
        self._bounds: dict = {}

    @property
    def id(self) -> str:
        return f"turbo{self.bits}g{self.group_size}-rot{self.seed}"

    def check_head_dim(self, head_dim: int) -> None:
        if not is_power_of_two(head_dim):
            raise CodecError(f"TurboQuant needs a power-of-two head_dim for its Hadamard rotation; "
                             f"this model has head_dim {head_dim} (use --kv-bits for affine instead)")
        if head_dim % self.group_size:
            raise CodecError(f"turbo group size {self.group_size} does not divide head_dim {head_dim}")

    def bind(self, head_dim: int) -> None:
        if self.rotation is None:
            self.check_head_dim(head_dim)
            self.rotation = Rotation(head_dim, self.seed)

    def _tables(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        c = self._centroids.get(device)
        if c is None:
            c = self._centroids[device] = codebook(self.bits).to(device)
            self._bounds[device] = codebook_boundaries(self.bits).to(device)
        return c, self._bounds[device]

    def fields(self, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> list[FieldSpec]:
        return [
            FieldSpec("codes", (num_kv_heads, head_dim * self.bits // 8), torch.uint8),
            FieldSpec("scale", (num_kv_heads, head_dim // self.group_size), torch.float16),
        ]

    def encode(self, x: torch.Tensor, dtype: torch.dtype) -> list[torch.Tensor]:
        D = x.shape[-1]
        self.bind(D)
        y = self.rotation.rotate(x.float())
        lead = y.shape[:-1]
        yg = y.reshape(*lead, D // self.group_size, self.group_size)
        rms = yg.pow(2).mean(-1).sqrt().clamp_min(6.2e-5).half()
        _, bounds = self._tables(y.device)
        idx = torch.bucketize((yg / rms.float()[..., None]).contiguous(), bounds)
        return [pack_bits(idx.reshape(*lead, D), self.bits), rms]

    def decode(self, parts: list[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
        codes, rms = parts
        D = codes.shape[-1] * 8 // self.bits
        self.bind(D)
        lead = codes.shape[:-1]
        cents, _ = self._tables(codes.device)
        idx = unpack_bits(codes, self.bits, D)
        y = cents[idx].view(*lead, D // self.group_size, self.group_size) * rms.float()[..., None]
        return y.view(*lead, D).to(dtype)
