"""Randomized Walsh–Hadamard rotations: fixed ±1 signs, then the normalized FWHT.

R(x) = H (s ⊙ x) / sqrt(D) is orthogonal, so it preserves dot products and
spreads each vector's energy evenly over coordinates (outlier channels are
what break low-bit per-group quantization). Sign vectors come from blake2b of
(seed, dim), so they are the same on every machine and across restarts.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import torch


def is_power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def fwht(x: torch.Tensor) -> torch.Tensor:
    """Normalized fast Walsh–Hadamard transform over the last dim (a power of two).

    Orthogonal and its own inverse: fwht(fwht(x)) == x.
    """
    d = x.shape[-1]
    if not is_power_of_two(d):
        raise ValueError(f"the Walsh–Hadamard transform needs a power-of-two size, got {d}")
    lead = x.shape[:-1]
    y = x.reshape(-1, d)
    h = 1
    while h < d:
        y = y.view(-1, d // (2 * h), 2, h)
        a, b = y[:, :, 0], y[:, :, 1]
        y = torch.stack((a + b, a - b), dim=2).view(-1, d)
        h *= 2
    return (y * (d ** -0.5)).view(*lead, d)


def random_signs(dim: int, seed: int) -> torch.Tensor:
    """[dim] float32 of ±1, a pure function of (dim, seed)."""
    out = bytearray()
    counter = 0
    while len(out) * 8 < dim:
        out += hashlib.blake2b(f"augury-signs:{seed}:{dim}:{counter}".encode(), digest_size=64).digest()
        counter += 1
    bits = torch.tensor(list(out), dtype=torch.int64)
    bits = ((bits[:, None] >> torch.arange(8)) & 1).reshape(-1)[:dim]
    return 1.0 - 2.0 * bits.to(torch.float32)


def hadamard_matrix(dim: int) -> torch.Tensor:
    """[dim, dim] float32 normalized Hadamard (symmetric, orthogonal)."""
    return fwht(torch.eye(dim, dtype=torch.float32))


@dataclass
class Rotation:
    """x -> x @ M (row vectors), M = diag(s) H / sqrt(D); inverse y -> y @ M^T.

    One [D, D] matmul beats log2(D) butterfly passes at head sizes (64..256) in eager torch.
    """

    dim: int
    seed: int
    _mats: dict = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if not is_power_of_two(self.dim):
            raise ValueError(f"a Hadamard rotation needs a power-of-two head_dim, got {self.dim}")
        self.signs = random_signs(self.dim, self.seed)
        self.matrix = self.signs[:, None] * hadamard_matrix(self.dim)  # [D, D] float32

    def _mat(self, dtype: torch.dtype, device: torch.device, transpose: bool) -> torch.Tensor:
        key = (dtype, device, transpose)
        m = self._mats.get(key)
        if m is None:
            m = (self.matrix.t() if transpose else self.matrix).contiguous().to(device=device, dtype=dtype)
            self._mats[key] = m
        return m

    def rotate(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., D] -> R x, in x's dtype."""
        return x @ self._mat(x.dtype, x.device, False)

    def unrotate(self, y: torch.Tensor) -> torch.Tensor:
        """y [..., D] -> R^T y."""
        return y @ self._mat(y.dtype, y.device, True)
