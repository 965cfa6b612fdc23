"""Typed options of `augury bench`, shared by every scenario."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

ALL_PEERS = ("llama.cpp", "hf", "limit")


@dataclass
class BenchOptions:
    model: str = "smollm2"
    weights: str = "int4"  # the GGUF is Q4_1: compare at the same bits
    dtype: str = "auto"
    device: str = "cpu"
    threads: int = 2
    reps: int = 5
    warmup: int = 1
    out: Path = Path("bench-out")
    peers: tuple[str, ...] = ALL_PEERS
    kv_budget: str | None = None
    compile: bool = False  # torch.compile augury's forward (engine --compile)
    # per scenario
    prefill_lens: tuple[int, ...] = (1024, 4096)
    decode_prompt: int = 32
    decode_tokens: int = 256
    batch_sizes: tuple[int, ...] = (1, 4, 8, 16, 64)
    batch_prompt: int = 32
    batch_tokens: int = 128
    hf_max_batch: int = 16  # HF eager at B=64 on a 2-core CPU takes minutes per rep
    spec_sets: tuple[str, ...] = ("grounded", "chat")
    spec_methods: tuple[str, ...] = ("ngram", "layerskip")
    spec_max_tokens: int = 128
    spec_layers: int | None = None
    pld_tokens: tuple[int, ...] = (10,)
    server_clients: tuple[int, ...] = (1, 4, 16)
    server_tokens: int = 128
    extra: dict = field(default_factory=dict)

    def validate(self) -> None:
        unknown = set(self.peers) - set(ALL_PEERS)
        if unknown:
            raise ValueError(f"--peers: unknown {', '.join(sorted(unknown))}; choose from {', '.join(ALL_PEERS)}")
        if self.reps < 1:
            raise ValueError("--reps must be >= 1")
        if self.threads < 1:
            raise ValueError("--threads must be >= 1")

    def engine_dict(self) -> dict:
        return {"model": self.model, "weights": self.weights, "dtype": self.dtype, "device": self.device,
                "threads": self.threads, "compile": self.compile, "reps": self.reps, "warmup": self.warmup, "peers": list(self.peers)}
