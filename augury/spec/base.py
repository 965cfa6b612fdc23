"""The DraftSource seam: everything method-specific about speculative decoding.

A drafter proposes tokens for some requests; the engine's verifier (one target
forward over [pending token + drafts], `spec/verify.py`) decides what is kept.
A drafter therefore changes only speed, never what is emitted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, Sequence

from torch import Tensor

from augury.engine.request import Request


@dataclass
class Draft:
    ids: list[int]
    # [len(ids), V] draft probabilities, or None for a deterministic drafter (q one-hot)
    probs: Tensor | None = None


class DraftSource(Protocol):
    name: str

    def propose(self, reqs: Sequence[Request], max_tokens: Sequence[int]) -> list[Draft]:
        """Up to max_tokens[i] draft tokens continuing reqs[i].all_ids (zero allowed)."""

    def on_verified(self, req: Request, num_accepted: int) -> None:
        """The target kept `num_accepted` of the drafts: roll own state back to that."""

    def release(self, req: Request) -> None:
        """The request ended (finished, cancelled, failed, preempted): free own state."""


@dataclass
class SpecStats:
    """Per-request telemetry reported as usage.speculation."""

    method: str
    drafted: int = 0
    accepted: int = 0
    rounds: int = 0
    accepted_by_position: list[int] = field(default_factory=list)

    def record(self, num_drafted: int, num_accepted: int) -> None:
        self.rounds += 1
        self.drafted += num_drafted
        self.accepted += num_accepted
        while len(self.accepted_by_position) < num_drafted:
            self.accepted_by_position.append(0)
        for i in range(num_accepted):
            self.accepted_by_position[i] += 1

    def as_dict(self) -> dict:
        return {
            "method": self.method,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "rounds": self.rounds,
            "acceptance_rate": self.accepted / self.drafted if self.drafted else 0.0,
            # tokens emitted per verify round (accepted drafts + the target's own token)
            "mean_accepted_length": (self.accepted + self.rounds) / self.rounds if self.rounds else 0.0,
            "accepted_by_position": list(self.accepted_by_position),
        }
