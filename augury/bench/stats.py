"""Pure arithmetic of a benchmark: summaries of repeated samples and augury-over-peer ratios."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Mapping, Sequence


@dataclass(frozen=True)
class Summary:
    """Repeated measurements of one series in one case."""

    median: float
    min: float
    max: float
    n: int
    samples: tuple[float, ...] = field(default_factory=tuple)

    def as_dict(self) -> dict:
        return {"median": self.median, "min": self.min, "max": self.max, "n": self.n,
                "samples": list(self.samples)}


def summarize(samples: Sequence[float]) -> Summary:
    """Median (the figure we report: robust on a shared machine), min and max."""
    if not samples:
        raise ValueError("summarize: no samples")
    xs = [float(x) for x in samples]
    return Summary(statistics.median(xs), min(xs), max(xs), len(xs), tuple(xs))


def ratio(subject: float, peer: float, higher_is_better: bool = True) -> float | None:
    """How many times better the subject is than the peer (>1: subject better).

    For speeds this is subject/peer; for latencies (lower is better) peer/subject.
    None when either side is zero or missing: a ratio to nothing is not a number.
    """
    if not subject or not peer or subject <= 0 or peer <= 0:
        return None
    return subject / peer if higher_is_better else peer / subject


def paired_ratios(subject: Sequence[float], base: Sequence[float]) -> list[float]:
    """subject[i] / base[i] for each repetition i both were measured in (a case against another
    case of the same engine, e.g. B=8 against B=1); repetitions with a zero or missing side dropped."""
    return [a / b for a, b in zip(subject, base) if a > 0 and b > 0]


def case_ratios(medians: Mapping[str, float], subject: str, higher_is_better: bool = True) -> dict[str, float | None]:
    """Ratio of the subject's median to every other series' median."""
    if subject not in medians:
        return {}
    s = medians[subject]
    return {k: ratio(s, v, higher_is_better) for k, v in medians.items() if k != subject}


def rotate(names: Sequence[str], rep: int) -> list[str]:
    """Order of the engines in repetition `rep`: rotated so no engine always runs first (or right after another)."""
    if not names:
        return []
    k = rep % len(names)
    return list(names[k:]) + list(names[:k])
