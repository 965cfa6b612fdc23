"""Load a GGUF file as a Checkpoint in Hugging Face conventions.

llama.cpp's converter changes tensors on the way in; we undo it here:
- llama arch: q/k rows were permuted for interleaved (GPT-J style) rope; HF uses
  rotate-half, so the permutation is reversed.
- gemma3: RMSNorm weights were stored as (1 + w); HF keeps w and adds 1 at run time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import numpy as np
import torch

from .checkpoint import Checkpoint
from .fingerprint import combine, file_digest
from .gguf_config import config_from_metadata, generation_config, tokenizer_metadata
from .gguf_dequant import dequantize
from .gguf_names import hf_name
from .gguf_reader import GGUFHeader, GGUFTensorInfo, open_data, read_header, tensor_bytes


def unpermute_rope_rows(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Undo llama.cpp's q/k permute. w: (n_heads * head_dim, ...) -> same shape.

    llama.cpp maps HF rows [h, half, i] (rotate-half pairs i and i+hd/2) to
    [h, i, half] (adjacent pairs); we go back.
    """
    rest = w.shape[1:]
    head_dim = w.shape[0] // n_heads
    return w.reshape(n_heads, head_dim // 2, 2, *rest).transpose(1, 2).reshape(w.shape).contiguous()


def _transform(arch: str, name: str, t: torch.Tensor, cfg: dict) -> torch.Tensor:
    if arch == "llama":
        if ".self_attn.q_proj." in name:
            return unpermute_rope_rows(t, cfg["num_attention_heads"])
        if ".self_attn.k_proj." in name:
            return unpermute_rope_rows(t, cfg["num_key_value_heads"])
    if arch == "gemma3" and name.endswith("norm.weight"):
        return t - 1.0
    return t


class GGUFSource:
    """Parsed header plus everything derived from it; tensors are converted on demand."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self.header: GGUFHeader = read_header(self.path)
        meta = self.header.metadata
        self.arch = str(meta.get("general.architecture"))
        by_name = {t.name: t for t in self.header.tensors}
        embd = by_name.get("token_embd.weight")
        rows = embd.shape[0] if embd is not None else len(meta.get("tokenizer.ggml.tokens") or [])
        freqs = self._read(by_name["rope_freqs.weight"]).numpy() if "rope_freqs.weight" in by_name else None
        self.config = config_from_metadata(meta, rows, "output.weight" in by_name, freqs)
        # Resolve names up front so an unsupported tensor fails at load, not mid-stream.
        self.plan: list[tuple[str, GGUFTensorInfo]] = [
            (n, t) for t in self.header.tensors if (n := hf_name(self.arch, t.name)) is not None
        ]
        digest = file_digest(self.path, self.header.data_offset)
        self.fingerprint = combine("gguf", [digest], self.config)

    def _read(self, info: GGUFTensorInfo, mm: np.ndarray | None = None) -> torch.Tensor:
        mm = open_data(self.path) if mm is None else mm
        return dequantize(tensor_bytes(mm, info), info.qtype, info.shape)

    def tensor_names(self) -> list[str]:
        return [n for n, _ in self.plan]

    def iter_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """(HF name, float32 tensor in HF conventions), in file order."""
        mm = open_data(self.path)
        for name, info in self.plan:
            yield name, _transform(self.arch, name, self._read(info, mm), self.config)

    def checkpoint(self, tensors=None) -> Checkpoint:
        meta = self.header.metadata
        return Checkpoint(
            source=str(self.path),
            kind="gguf",
            config=self.config,
            tensors=tensors or self.iter_tensors,
            generation_config=generation_config(meta),
            tokenizer_files={"kind": "gguf", "metadata": tokenizer_metadata(meta)},
            fingerprint=self.fingerprint,
        )
