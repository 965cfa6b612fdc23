"""Entry point: a model name or path -> Checkpoint (config, tokenizer source, tensors)."""

from __future__ import annotations

import os
from pathlib import Path

from .checkpoint import Checkpoint
from .convert_cache import cached_tensors
from .gguf_file import GGUFSource
from .hf_dir import load_hf_dir
from .registry import resolve_model


def load_checkpoint(
    path_or_name: str | os.PathLike[str],
    *,
    cache_dir: Path | str | None = None,
    progress: bool = True,
    use_cache: bool = True,
) -> Checkpoint:
    """Resolve and open a checkpoint; GGUF tensors come from the converted-weight cache.

    HF tensors are yielded in their stored dtype; GGUF tensors as float32.
    use_cache=False dequantizes the GGUF on every `tensors()` call instead.
    """
    path = resolve_model(path_or_name, cache_dir=cache_dir)
    if path.is_dir():
        return load_hf_dir(path)
    src = GGUFSource(path)
    if not use_cache:
        return src.checkpoint()
    stream = cached_tensors(
        src.fingerprint, src.iter_tensors, len(src.plan), cache_dir=cache_dir, progress=progress
    )
    return src.checkpoint(stream)
