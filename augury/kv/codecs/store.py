"""Encoded per-layer KV storage: one tensor per codec field, indexed by pool slot."""

from __future__ import annotations

import functools

import torch

from augury.kv.codecs.base import SideCodec


@functools.lru_cache(maxsize=1)
def _encode_kernel():
    """(encode_write, write_supported) from the Triton module, or None where triton is unusable."""
    try:
        from augury.kv.codecs.triton_encode import encode_write, write_supported
    except Exception:
        return None
    return encode_write, write_supported


class EncodedStore:
    """One side (K or V) of one layer: `parts[j]` is [num_slots, *fields[j].shape]."""

    def __init__(self, codec: SideCodec, num_slots: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device | str):
        codec.bind(head_dim)
        self.codec = codec
        self.dtype = dtype  # compute dtype reads come back in
        self.num_kv_heads, self.head_dim = num_kv_heads, head_dim
        self.fields = codec.fields(num_kv_heads, head_dim, dtype)
        self.parts = [torch.zeros((num_slots, *f.shape), dtype=f.dtype, device=device) for f in self.fields]
        self.fused = True  # on CUDA, write/read through the Triton kernels where they take the codec (benchmarks flip it)

    @property
    def rotation(self):
        return self.codec.rotation

    @property
    def num_slots(self) -> int:
        return self.parts[0].shape[0]

    def write(self, slots: torch.Tensor, x: torch.Tensor) -> None:
        """slots [T] long, x [T, Hkv, D]: encode and store (one fused launch on CUDA)."""
        if self.fused and x.is_cuda:
            k = _encode_kernel()
            if k is not None and k[1](self.codec):
                k[0](self, slots, x)
                return
        for dst, src in zip(self.parts, self.codec.encode(x, self.dtype)):
            dst.index_copy_(0, slots, src)

    def read(self, slots: torch.Tensor) -> torch.Tensor:
        """slots [...] long -> [..., Hkv, D] in the compute dtype, in the codec's (rotated) basis."""
        return self.codec.decode([p[slots] for p in self.parts], self.dtype)

    def nbytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.parts)
