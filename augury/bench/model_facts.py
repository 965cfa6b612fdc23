"""Sizes that set the physical limit of a model: weight bytes read per decode step and FLOPs per prefill token."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ModelFacts:
    path: str
    weight_bytes: int  # every tensor once, at the file's own bits (what one decode step must read)
    block_params: int  # parameters of the transformer blocks (the per-token matmuls of prefill)
    num_layers: int
    num_heads: int
    head_dim: int

    def decode_limit(self, bandwidth: float, batch: int = 1) -> float:
        """Aggregate tok/s if a step cost only reading the weights once (KV reads ignored: an upper bound)."""
        return batch * bandwidth / self.weight_bytes

    def prefill_flops_per_token(self, prompt_len: int) -> float:
        """2 FLOPs per block weight, plus causal attention (QK^T and AV) averaged over the prompt;
        the LM head runs for the last token only, so it is left out."""
        attn = 2 * 2 * self.num_layers * self.num_heads * self.head_dim * (prompt_len / 2)
        return 2 * self.block_params + attn

    def prefill_limit(self, flops: float, prompt_len: int) -> float:
        return flops / self.prefill_flops_per_token(prompt_len)


def gguf_facts(path: Path) -> ModelFacts:
    from gguf import GGUFReader

    r = GGUFReader(str(path))

    def field(key: str):
        f = r.fields.get(key)
        if f is None:
            return None
        v = f.parts[f.data[0]]
        return bytes(v).decode() if f.types and f.types[0].name == "STRING" else int(v[0])

    arch = field("general.architecture")
    layers = field(f"{arch}.block_count")
    heads = field(f"{arch}.attention.head_count")
    hidden = field(f"{arch}.embedding_length")
    head_dim = field(f"{arch}.attention.key_length") or hidden // heads
    wbytes = sum(int(t.n_bytes) for t in r.tensors)
    block = sum(int(t.n_elements) for t in r.tensors if t.name.startswith("blk."))
    return ModelFacts(str(path), wbytes, block, int(layers), int(heads), int(head_dim))
