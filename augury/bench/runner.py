"""The measurement loop: warm every engine up, then repeat, alternating engines in rotated order."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import Callable

from augury.bench.report import CaseResult
from augury.bench.stats import rotate, summarize


@dataclass
class Sample:
    """One measurement: the value reported (a speed or a latency) and optional side figures."""

    value: float
    extras: dict[str, float] = field(default_factory=dict)


Measure = Callable[[], Sample]


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def run_case(name: str, unit: str, subject: str, series: dict[str, Measure], reps: int, warmup: int = 1,
             higher_is_better: bool = True, warmups: dict[str, Measure] | None = None) -> CaseResult:
    """Measure every series `reps` times after `warmup` unrecorded runs; engines alternate within a rep
    so a noisy neighbour on a shared machine hits all of them alike. `warmups` replaces a series'
    warm-up run with a cheaper one (e.g. one task instead of a whole task set)."""
    names = list(series)
    for w in range(warmup):
        for n in names:
            log(f"{name}: warm-up {n}")
            (warmups or {}).get(n, series[n])()
    values: dict[str, list[float]] = {n: [] for n in names}
    extras: dict[str, dict[str, list[float]]] = {n: {} for n in names}
    for r in range(reps):
        for n in rotate(names, r):
            s = series[n]()
            values[n].append(s.value)
            for k, v in s.extras.items():
                extras[n].setdefault(k, []).append(v)
            log(f"{name}: rep {r + 1}/{reps} {n} = {s.value:.2f} {unit}")
    case = CaseResult(name, unit, subject, higher_is_better)
    case.results = {n: summarize(v) for n, v in values.items() if v}
    case.extras = {n: {k: summarize(v).median for k, v in ex.items()} for n, ex in extras.items() if ex}
    return case
