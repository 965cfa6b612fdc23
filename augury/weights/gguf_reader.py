"""Minimal GGUF (v2/v3) header parser.

`gguf.GGUFReader` builds a numpy view per metadata string, which takes ~20 s
on Gemma 3's 262k-token vocabulary; parsing the header with `struct` takes a
fraction of a second and gives plain Python values directly.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from .errors import WeightsError

_MAGIC = b"GGUF"
# GGUF value type id -> (struct format, numpy dtype) for fixed-size scalars
_SCALARS: dict[int, tuple[str, str]] = {
    0: ("B", "u1"),
    1: ("b", "i1"),
    2: ("H", "<u2"),
    3: ("h", "<i2"),
    4: ("I", "<u4"),
    5: ("i", "<i4"),
    6: ("f", "<f4"),
    7: ("?", "u1"),
    10: ("Q", "<u8"),
    11: ("q", "<i8"),
    12: ("d", "<f8"),
}
_STRING, _ARRAY, _BOOL = 8, 9, 7


@dataclass(frozen=True)
class GGUFTensorInfo:
    name: str
    shape: tuple[int, ...]  # HF/numpy order (slowest dim first), i.e. GGUF ne reversed
    qtype: GGMLQuantizationType
    offset: int  # absolute byte offset in the file
    n_bytes: int


@dataclass(frozen=True)
class GGUFHeader:
    path: Path
    version: int
    metadata: dict[str, Any]  # plain Python values (lists for arrays)
    tensors: list[GGUFTensorInfo]
    data_offset: int  # absolute offset where tensor data starts
    file_size: int


class _Cursor:
    def __init__(self, buf: bytes) -> None:
        self.buf = buf
        self.pos = 0

    def unpack(self, fmt: str) -> Any:
        (v,) = struct.unpack_from("<" + fmt, self.buf, self.pos)
        self.pos += struct.calcsize("<" + fmt)
        return v

    def string(self) -> str:
        n = self.unpack("Q")
        s = self.buf[self.pos : self.pos + n]
        if len(s) != n:
            raise WeightsError("GGUF header is truncated")
        self.pos += n
        return s.decode("utf-8", errors="replace")

    def value(self, vtype: int) -> Any:
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            etype, count = self.unpack("I"), self.unpack("Q")
            if etype == _STRING:
                return [self.string() for _ in range(count)]
            if etype == _ARRAY:
                return [self.value(_ARRAY) for _ in range(count)]
            if etype not in _SCALARS:
                raise WeightsError(f"GGUF array has unknown element type {etype}")
            dt = np.dtype(_SCALARS[etype][1])
            arr = np.frombuffer(self.buf, dtype=dt, count=count, offset=self.pos)
            self.pos += dt.itemsize * count
            return arr.astype(bool).tolist() if etype == _BOOL else arr.tolist()
        if vtype not in _SCALARS:
            raise WeightsError(f"GGUF metadata has unknown value type {vtype}")
        v = self.unpack(_SCALARS[vtype][0])
        return bool(v) if vtype == _BOOL else v


def read_header(path: Path | str) -> GGUFHeader:
    """Parse metadata and tensor infos; tensor bytes are not read."""
    path = Path(path)
    size = path.stat().st_size
    with path.open("rb") as f:
        head = f.read(24)
        if len(head) < 24 or head[:4] != _MAGIC:
            raise WeightsError(f"{path} is not a GGUF file (bad magic)")
        version = struct.unpack_from("<I", head, 4)[0]
        if version not in (2, 3):
            raise WeightsError(f"{path}: GGUF version {version} is not supported (need 2 or 3)")
        f.seek(0)
        # Headers are a few MB at most (vocabularies); grow the read if a parse runs past the end.
        chunk = min(size, 16 << 20)
        while True:
            f.seek(0)
            buf = f.read(chunk)
            try:
                return _parse(path, buf, version, size)
            except (struct.error, WeightsError, ValueError) as e:
                if chunk >= size:
                    raise WeightsError(f"{path}: corrupt or truncated GGUF header ({e})") from e
                chunk = min(size, chunk * 4)


def _parse(path: Path, buf: bytes, version: int, size: int) -> GGUFHeader:
    c = _Cursor(buf)
    c.pos = 8
    n_tensors, n_kv = c.unpack("Q"), c.unpack("Q")
    meta: dict[str, Any] = {}
    for _ in range(n_kv):
        key = c.string()
        meta[key] = c.value(c.unpack("I"))
    raw: list[tuple[str, tuple[int, ...], int, int]] = []
    for _ in range(n_tensors):
        name = c.string()
        ndim = c.unpack("I")
        ne = tuple(c.unpack("Q") for _ in range(ndim))
        raw.append((name, tuple(reversed(ne)), c.unpack("I"), c.unpack("Q")))
    align = int(meta.get("general.alignment", 32))
    data_offset = (c.pos + align - 1) // align * align
    infos = []
    for name, shape, qt, off in raw:
        try:
            qtype = GGMLQuantizationType(qt)
        except ValueError as e:
            raise WeightsError(f"{path}: tensor {name} has unknown ggml type {qt}") from e
        block, type_size = GGML_QUANT_SIZES[qtype]
        n_el = int(np.prod(shape)) if shape else 1
        n_bytes = n_el // block * type_size
        start = data_offset + off
        if start + n_bytes > size:
            raise WeightsError(f"{path}: tensor {name} runs past the end of the file (truncated download?)")
        infos.append(GGUFTensorInfo(name, shape, qtype, start, n_bytes))
    return GGUFHeader(path, version, meta, infos, data_offset, size)


def tensor_bytes(mm: np.ndarray, info: GGUFTensorInfo) -> np.ndarray:
    """Raw bytes of one tensor as a uint8 view of the file memmap."""
    return mm[info.offset : info.offset + info.n_bytes]


def open_data(path: Path | str) -> np.ndarray:
    return np.memmap(path, dtype=np.uint8, mode="r")
