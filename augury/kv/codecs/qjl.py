"""QJL-style 1-bit residual for keys (behind a flag: `turbo:rk4v3+qjl`, API `"qjl": true`).

After the base key codec stores k̂, the residual r = k − k̂ (in the base codec's,
possibly rotated, basis) is sketched with a fixed Gaussian matrix S [m, D]:
we store sign(S r) bit-packed and ‖r‖ (fp16). For any query q,

    E_S[ (S q) · sign(S r) ] = m · sqrt(2/π) · q·r / ‖r‖,

so q·r ≈ ‖r‖·sqrt(π/2)/m · (S q)·sign(S r) = q·r̂ with r̂ = ‖r‖·sqrt(π/2)/m · Sᵀ sign(S r).
Decode returns k̂ + r̂, so attention reads it through the ordinary decode-on-read
path (the fused Triton kernels know only AffineCodec/TurboCodec and refuse it).

The estimate is unbiased over sketches but not low-variance: for one fixed S its
inner-product error has variance ≈ (π/2)·‖q‖²‖r‖²/m, while leaving r out costs
≈ ‖q‖²‖r‖²/D. At m = D the correction adds more noise than the residual it
removes; it pays only where the base codec is biased or with m > (π/2)·D.
`augury eval kv` measures it (see docs/data/kv-eval-*.json).

S is a pure function of (m, D, seed) built from blake2b, not torch's RNG, so the
same bytes decode identically on every machine and after an SSD restore.
"""

from __future__ import annotations

import hashlib
import math

import torch

from augury.kv.codecs.base import CodecError, FieldSpec, SideCodec
from augury.kv.codecs.packing import pack_bits, unpack_bits

QJL_SEED = 0x514A4C  # "QJL": fixed so stored signs decode the same everywhere
_SQRT_HALF_PI = math.sqrt(math.pi / 2)


def _uniform53(count: int, tag: str) -> torch.Tensor:
    """[count] float64 in (0, 1): 53-bit integers from blake2b(tag, counter), assembled byte by byte
    (no dependence on the machine's endianness or torch's generator)."""
    per = 8  # a 64-byte digest gives 8 values of 7 bytes (56 bits, 53 kept)
    chunks = []
    for c in range(-(-count // per)):
        chunks.append(hashlib.blake2b(f"{tag}:{c}".encode(), digest_size=64).digest()[: per * 7])
    by = torch.frombuffer(bytearray(b"".join(chunks)), dtype=torch.uint8).to(torch.int64).view(-1, 7)
    word = (by << (torch.arange(7, dtype=torch.int64) * 8)).sum(-1) >> 3  # 53 bits
    return (word[:count].to(torch.float64) + 0.5) / float(1 << 53)


def sketch_matrix(m: int, dim: int, seed: int = QJL_SEED) -> torch.Tensor:
    """[m, dim] float32 with i.i.d. N(0, 1) entries, a pure function of (m, dim, seed) (Box–Muller)."""
    n = m * dim
    half = -(-n // 2)
    u = _uniform53(2 * half, f"augury-qjl:{seed}:{m}:{dim}")
    u1, u2 = u[:half], u[half:]
    rad = torch.sqrt(-2.0 * torch.log(u1))
    z = torch.cat((rad * torch.cos(2 * math.pi * u2), rad * torch.sin(2 * math.pi * u2)))[:n]
    return z.to(torch.float32).view(m, dim)


class QJLResidualCodec(SideCodec):
    """Wraps a key codec: base fields + packed sign(S r) + fp16 ‖r‖."""

    def __init__(self, base: SideCodec, sketch_dim: int | None = None, seed: int = QJL_SEED):
        if base.is_native:
            raise CodecError("the QJL residual needs an encoded key codec (a native cache has no residual)")
        if sketch_dim is not None and (sketch_dim < 8 or sketch_dim % 8):
            raise CodecError(f"QJL sketch size must be a positive multiple of 8, got {sketch_dim}")
        self.base, self.sketch_dim, self.seed = base, sketch_dim, seed
        self._mats: dict = {}

    @property
    def rotation(self):  # the residual lives in the base codec's basis, so attention rotates q the same way
        return self.base.rotation

    @property
    def id(self) -> str:
        m = "D" if self.sketch_dim is None else str(self.sketch_dim)
        return f"{self.base.id}+qjl-m{m}-s{self.seed:x}"

    def m(self, head_dim: int) -> int:
        return self.sketch_dim or head_dim

    def check_head_dim(self, head_dim: int) -> None:
        self.base.check_head_dim(head_dim)
        if head_dim % 8:
            raise CodecError(f"QJL sign packing needs head_dim divisible by 8, got {head_dim}")

    def bind(self, head_dim: int) -> None:
        self.check_head_dim(head_dim)
        self.base.bind(head_dim)

    def _sketch(self, head_dim: int, device: torch.device) -> torch.Tensor:
        key = (head_dim, device)
        s = self._mats.get(key)
        if s is None:
            s = self._mats[key] = sketch_matrix(self.m(head_dim), head_dim, self.seed).to(device)
        return s

    def fields(self, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> list[FieldSpec]:
        return self.base.fields(num_kv_heads, head_dim, dtype) + [
            FieldSpec("qjl_signs", (num_kv_heads, self.m(head_dim) // 8), torch.uint8),
            FieldSpec("qjl_norm", (num_kv_heads,), torch.float16),
        ]

    def encode(self, x: torch.Tensor, dtype: torch.dtype) -> list[torch.Tensor]:
        D = x.shape[-1]
        self.bind(D)
        parts = self.base.encode(x, dtype)
        y = x.float() if self.rotation is None else self.rotation.rotate(x.float())
        r = y - self.base.decode(parts, torch.float32)  # [N, Hkv, D] in the stored basis
        proj = r @ self._sketch(D, x.device).t()  # [N, Hkv, m]
        signs = pack_bits((proj >= 0).to(torch.uint8), 1)
        return parts + [signs, r.norm(dim=-1).half()]

    def decode(self, parts: list[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
        *base_parts, signs, norm = parts
        k = self.base.decode(base_parts, torch.float32)
        D = k.shape[-1]
        S = self._sketch(D, k.device)
        pm = unpack_bits(signs, 1, S.shape[0]).to(torch.float32) * 2 - 1  # [..., Hkv, m] of ±1
        coef = norm.float() * (_SQRT_HALF_PI / S.shape[0])
        return (k + coef[..., None] * (pm @ S)).to(dtype)
