"""Cheap, stable identity hashes for weight files (no full-file hash on every load).

A file is identified by its size, its header bytes (all metadata, names,
shapes, dtypes, offsets) and a few evenly spaced samples of its data: enough
to tell re-quantized or fine-tuned files apart without reading gigabytes.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

_SAMPLES = 16
_SAMPLE_BYTES = 64 << 10


def file_digest(path: Path, header_len: int) -> str:
    """sha256 over (size, the first header_len bytes, sampled data chunks)."""
    size = path.stat().st_size
    h = hashlib.sha256(f"{path.suffix}|{size}|".encode())
    with path.open("rb") as f:
        h.update(f.read(header_len))
        data = size - header_len
        for i in range(_SAMPLES if data > 0 else 0):
            f.seek(header_len + data * i // _SAMPLES)
            h.update(f.read(_SAMPLE_BYTES))
    return h.hexdigest()


def combine(kind: str, parts: list[str], config: dict[str, Any]) -> str:
    """Fingerprint of a checkpoint: its kind, its files' digests and its config."""
    h = hashlib.sha256(kind.encode())
    for p in parts:
        h.update(p.encode())
    h.update(json.dumps(config, sort_keys=True, default=str).encode())
    return h.hexdigest()[:32]
