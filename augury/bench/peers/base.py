"""What every measured engine offers the scenarios, timed the same way from the outside."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Iterable, Protocol, Sequence


class PeerUnavailable(RuntimeError):
    """The peer cannot run here (package missing, wrong file kind); the message says how to get it."""


@dataclass
class GenTiming:
    """One timed generation. Times are seconds from the call, measured by the harness."""

    prompt_tokens: int
    gen_tokens: int
    ttft_s: float
    total_s: float
    extras: dict[str, float] = field(default_factory=dict)

    @property
    def decode_rate(self) -> float:
        """Tokens after the first over the time after the first: prefill-free decode speed."""
        dt = self.total_s - self.ttft_s
        return (self.gen_tokens - 1) / dt if self.gen_tokens > 1 and dt > 0 else 0.0

    @property
    def prefill_rate(self) -> float:
        return self.prompt_tokens / self.ttft_s if self.ttft_s > 0 else 0.0


@dataclass
class BatchTiming:
    """One timed batch: the aggregate end to end, and (engines that report each sequence's first-token
    time) the decode phase alone, as llama-batched-bench's S_TG: the tokens after each sequence's first
    over the time after the last sequence got its first token (0: not reported)."""

    gen_tokens: int
    total_s: float
    sequences: int = 0
    all_first_s: float = 0.0

    @property
    def rate(self) -> float:
        return self.gen_tokens / self.total_s if self.total_s > 0 else 0.0

    @property
    def decode_rate(self) -> float | None:
        dt = self.total_s - self.all_first_s
        if self.all_first_s <= 0 or dt <= 0 or self.gen_tokens <= self.sequences:
            return None
        return (self.gen_tokens - self.sequences) / dt


class Peer(Protocol):
    name: str

    def generate(self, ids: Sequence[int], max_tokens: int, ignore_eos: bool = True,
                 method: str | None = None) -> GenTiming: ...

    def generate_batch(self, prompts: Sequence[Sequence[int]], max_tokens: int) -> BatchTiming | None: ...

    def close(self) -> None: ...


def time_stream(tokens: Iterable[int], prompt_tokens: int, max_tokens: int, eos: set[int] | frozenset[int],
                ignore_eos: bool, t0: float) -> GenTiming:
    """Consume a token stream until max_tokens (or EOS), timing the first and last token."""
    n, ttft = 0, 0.0
    for tok in tokens:
        n += 1
        if n == 1:
            ttft = time.perf_counter() - t0
        if n >= max_tokens or (not ignore_eos and tok in eos):
            break
    return GenTiming(prompt_tokens, n, ttft, time.perf_counter() - t0)
