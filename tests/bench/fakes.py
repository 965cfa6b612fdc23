"""Deterministic stand-ins for engines: the harness's arithmetic is tested without timing anything real."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from augury.bench.peers.base import BatchTiming, GenTiming


@dataclass
class FakePeer:
    """Decodes at `rate` tok/s and prefills at `prefill` tok/s, reported without sleeping."""

    name: str
    rate: float
    prefill: float = 1000.0
    batch_factor: float | None = None  # aggregate = rate * B * factor; None = no batch support
    accepted: float | None = None
    closed: bool = False

    def generate(self, ids: Sequence[int], max_tokens: int, ignore_eos: bool = True,
                 method: str | None = None) -> GenTiming:
        ttft = len(ids) / self.prefill
        speed = self.rate * (2.0 if method == "ngram" else 1.0)
        extras = {"mean_accepted_length": self.accepted} if (method and self.accepted) else {}
        return GenTiming(len(ids), max_tokens, ttft, ttft + (max_tokens - 1) / speed, extras)

    def generate_batch(self, prompts: Sequence[Sequence[int]], max_tokens: int) -> BatchTiming | None:
        if self.batch_factor is None:
            return None
        n = len(prompts) * max_tokens
        total = n / (self.rate * len(prompts) * self.batch_factor)
        return BatchTiming(n, total, len(prompts), 0.2 * total)  # a fifth of the wall time to first tokens

    def close(self) -> None:
        self.closed = True


class FakeTokenizer:
    """Whitespace 'tokenizer' with a BOS of 1: enough for the prompt builders."""

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids = [10 + (hash(w) % 1000) for w in text.split()]
        return ([1] if add_special_tokens else []) + ids

    def encode_chat(self, messages: list[dict]) -> list[int]:
        return self.encode(" ".join(m["content"] for m in messages))
