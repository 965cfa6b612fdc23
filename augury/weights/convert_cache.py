"""Converted-weight cache: dequantized HF-convention tensors in one safetensors file.

Layout: <cache>/converted/<fingerprint>.safetensors. Each tensor is stored in
the narrowest float dtype that holds it exactly (bf16 / fp16 / fp32) and read
back as float32. The safetensors metadata carries a per-tensor crc32 so a
corrupted or truncated file is detected on load, deleted and rebuilt.
Files are written under a temp name and renamed, so readers never see a
partial file.
"""

from __future__ import annotations

import json
import os
import struct
import sys
import warnings
import zlib
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from .paths import converted_dir


# Bump when the conversion (names, transforms, dequantization) changes: old files are rebuilt.
CONVERTER_VERSION = "1"
_FORMAT = "augury-converted-1"


class CacheCorrupt(Exception):
    """The cache file fails its integrity checks."""


def cache_path(fingerprint: str, cache_dir: Path | str | None = None) -> Path:
    return converted_dir(cache_dir) / f"{fingerprint}.safetensors"


def narrowest_exact(t: torch.Tensor) -> torch.Tensor:
    """t in bf16 or fp16 if that round-trips bit-exactly, else float32."""
    t = t.float()
    for dt in (torch.bfloat16, torch.float16):
        narrow = t.to(dt)
        if torch.equal(narrow.float(), t):
            return narrow
    return t.contiguous()


def _crc(t: torch.Tensor) -> int:
    return zlib.crc32(memoryview(t.contiguous().view(torch.uint8).numpy()))


def write(
    path: Path, fingerprint: str, tensors: Iterator[tuple[str, torch.Tensor]], total: int, progress: bool
) -> list[str]:
    """Convert every tensor and write the file atomically; returns the names in order."""
    stored: dict[str, torch.Tensor] = {}
    it = tensors
    if progress:
        from tqdm import tqdm

        it = tqdm(tensors, total=total, desc="converting weights", unit="tensor", file=sys.stderr)
    for name, t in it:
        stored[name] = narrowest_exact(t)
    meta = {
        "format": _FORMAT,
        "converter": CONVERTER_VERSION,
        "fingerprint": fingerprint,
        "order": json.dumps(list(stored)),
        "crc32": json.dumps({k: _crc(v) for k, v in stored.items()}),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        save_file(stored, str(tmp), metadata=meta)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return list(stored)


def verify(path: Path, fingerprint: str) -> list[str]:
    """Check header, sizes and every tensor's crc32; returns tensor names in stored order."""
    size = path.stat().st_size
    with path.open("rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise CacheCorrupt("file too short")
        (n,) = struct.unpack("<Q", head)
        if n > size - 8:
            raise CacheCorrupt("header length past end of file")
        try:
            header = json.loads(f.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise CacheCorrupt(f"unreadable header: {e}") from e
    meta = header.pop("__metadata__", None) or {}
    if meta.get("format") != _FORMAT or meta.get("converter") != CONVERTER_VERSION:
        raise CacheCorrupt("written by another converter version")
    if meta.get("fingerprint") != fingerprint:
        raise CacheCorrupt("fingerprint mismatch")
    try:
        crcs: dict[str, int] = json.loads(meta["crc32"])
        order: list[str] = json.loads(meta["order"])
    except (KeyError, json.JSONDecodeError) as e:
        raise CacheCorrupt("missing checksums") from e
    if set(crcs) != set(header) or set(order) != set(header):
        raise CacheCorrupt("tensor list does not match checksums")
    base = 8 + n
    data = np.memmap(path, dtype=np.uint8, mode="r")
    end = 0
    for name, info in header.items():
        lo, hi = info["data_offsets"]
        end = max(end, hi)
        if base + hi > size:
            raise CacheCorrupt(f"{name} runs past the end of the file (truncated)")
        if zlib.crc32(memoryview(data[base + lo : base + hi])) != crcs[name]:
            raise CacheCorrupt(f"checksum mismatch in {name}")
    if base + end != size:
        raise CacheCorrupt("file size does not match its header")
    return order


def reader(path: Path, order: list[str]) -> Callable[[], Iterator[tuple[str, torch.Tensor]]]:
    def stream() -> Iterator[tuple[str, torch.Tensor]]:
        with safe_open(str(path), framework="pt") as f:
            for name in order:
                yield name, f.get_tensor(name).float()

    return stream


def cached_tensors(
    fingerprint: str,
    build: Callable[[], Iterator[tuple[str, torch.Tensor]]],
    total: int,
    *,
    cache_dir: Path | str | None = None,
    progress: bool = True,
) -> Callable[[], Iterator[tuple[str, torch.Tensor]]]:
    """A tensor stream served from the cache, converting (and caching) on a miss."""
    path = cache_path(fingerprint, cache_dir)
    if path.exists():
        try:
            return reader(path, verify(path, fingerprint))
        except (CacheCorrupt, OSError, ValueError, KeyError, TypeError) as e:
            warnings.warn(f"converted-weight cache {path} is invalid ({e}); rebuilding it")
            path.unlink(missing_ok=True)
    try:
        order = write(path, fingerprint, build(), total, progress)
    except OSError as e:
        # A read-only or full disk must not stop the model from loading.
        warnings.warn(f"could not write converted-weight cache {path} ({e}); converting in memory")
        return build
    return reader(path, order)


def list_entries(cache_dir: Path | str | None = None) -> list[dict[str, object]]:
    """Converted files on disk (for `augury cache`): fingerprint, path, size in bytes."""
    d = converted_dir(cache_dir)
    if not d.is_dir():
        return []
    return [
        {"fingerprint": p.stem, "path": str(p), "bytes": p.stat().st_size}
        for p in sorted(d.glob("*.safetensors"))
    ]


def clear(cache_dir: Path | str | None = None, fingerprint: str | None = None) -> int:
    """Delete converted files (one fingerprint or all, plus stale temp files); returns bytes freed."""
    d = converted_dir(cache_dir)
    if not d.is_dir():
        return 0
    pattern = f"{fingerprint}.safetensors" if fingerprint else "*.safetensors"
    victims = list(d.glob(pattern)) + ([] if fingerprint else list(d.glob(".*.tmp")))
    freed = 0
    for p in victims:
        try:
            size = p.stat().st_size
            p.unlink()
            freed += size
        except FileNotFoundError:
            pass
    return freed
