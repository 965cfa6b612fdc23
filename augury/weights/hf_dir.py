"""Load a Hugging Face model directory (config.json + safetensors shards) as a Checkpoint."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any, Iterator

import torch
from safetensors import safe_open

from .checkpoint import Checkpoint
from .errors import WeightsError
from .fingerprint import combine, file_digest

_ST_INDEX = "model.safetensors.index.json"
_BIN_INDEX = "pytorch_model.bin.index.json"
# Multimodal checkpoints (Gemma 3 4B+) nest the text model; we serve the text model only.
_PREFIX_MAP = (("model.language_model.", "model."), ("language_model.model.", "model."), ("language_model.lm_head.", "lm_head."))
_SKIP_PREFIX = ("vision_tower.", "model.vision_tower.", "multi_modal_projector.", "model.multi_modal_projector.")
_SKIP_SUFFIX = ("rotary_emb.inv_freq",)  # buffers some old checkpoints saved


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise WeightsError(f"cannot read {path}: {e}") from e


def _unique(files: list[str]) -> list[str]:
    return list(dict.fromkeys(files))


def weight_files(d: Path) -> list[Path]:
    """The checkpoint's weight files, in shard order; raises if there are none."""
    for index in (_ST_INDEX, _BIN_INDEX):
        if (d / index).exists():
            files = [d / f for f in _unique(list(_read_json(d / index).get("weight_map", {}).values()))]
            missing = [f.name for f in files if not f.exists()]
            if missing:
                raise WeightsError(f"{d}: shards listed in {index} are missing: {', '.join(missing)}")
            if not files:
                raise WeightsError(f"{d}/{index} lists no weight files")
            return files
    for pattern in ("model.safetensors", "model*.safetensors", "*.safetensors", "pytorch_model.bin"):
        found = sorted(d.glob(pattern))
        if found:
            return found
    raise WeightsError(
        f"{d} has config.json but no weights (expected model.safetensors, sharded "
        f"model-*.safetensors with {_ST_INDEX}, or pytorch_model.bin)"
    )


def hf_param_name(name: str) -> str | None:
    """Normalized HF text-model name, or None for tensors the engine does not use."""
    if name.startswith(_SKIP_PREFIX) or name.endswith(_SKIP_SUFFIX):
        return None
    for old, new in _PREFIX_MAP:
        if name.startswith(old):
            return new + name[len(old) :]
    return name


def _safetensors_header_len(path: Path) -> int:
    with path.open("rb") as f:
        head = f.read(8)
    if len(head) < 8:
        raise WeightsError(f"{path} is not a safetensors file (too short)")
    return 8 + struct.unpack("<Q", head)[0]


def _iter_file(path: Path) -> Iterator[tuple[str, torch.Tensor]]:
    if path.suffix == ".safetensors":
        with safe_open(str(path), framework="pt") as f:
            for key in f.keys():
                yield key, f.get_tensor(key)
    else:
        # weights_only refuses pickled code; mmap avoids a second copy in RAM.
        sd = torch.load(str(path), map_location="cpu", weights_only=True, mmap=True)
        yield from sd.items()


def load_hf_dir(path: Path | str) -> Checkpoint:
    d = Path(path)
    if not d.is_dir():
        raise WeightsError(f"{d} is not a directory")
    if not (d / "config.json").exists():
        raise WeightsError(
            f"{d} has no config.json; an HF model directory needs one (or pass a .gguf file)"
        )
    config = _read_json(d / "config.json")
    gen_path = d / "generation_config.json"
    gen = _read_json(gen_path) if gen_path.exists() else {}
    files = weight_files(d)
    digests = [
        f.name + ":" + file_digest(f, _safetensors_header_len(f) if f.suffix == ".safetensors" else 0)
        for f in files
    ]

    def tensors() -> Iterator[tuple[str, torch.Tensor]]:
        """(HF name, tensor) in the dtype stored on disk (bf16/fp16/fp32)."""
        for f in files:
            for key, t in _iter_file(f):
                name = hf_param_name(key)
                if name is not None and t.is_floating_point():
                    yield name, t

    return Checkpoint(
        source=str(d.resolve()),
        kind="hf",
        config=config,
        tensors=tensors,
        generation_config=gen,
        tokenizer_files={"kind": "hf_dir", "path": str(d.resolve())},
        fingerprint=combine("hf", digests, config),
    )
