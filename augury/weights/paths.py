"""Where augury keeps files it derives from models (converted weights, assembled GGUFs)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root(cache_dir: Path | str | None = None) -> Path:
    """`cache_dir` if given, else $AUGURY_CACHE_DIR, else ~/.cache/augury (not created here)."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    env = os.environ.get("AUGURY_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "augury"


def converted_dir(cache_dir: Path | str | None = None) -> Path:
    return cache_root(cache_dir) / "converted"


def models_dir(cache_dir: Path | str | None = None) -> Path:
    return cache_root(cache_dir) / "models"
