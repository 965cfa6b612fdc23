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


@dataclass
class CaseSpec:
    """One case to measure: its series (engine name -> measurement) and how to report it."""

    name: str
    unit: str
    subject: str  # the augury series the ratios are computed for
    series: dict[str, Measure]
    higher_is_better: bool = True
    # replaces a series' warm-up run with a cheaper one (e.g. one task instead of a whole task set)
    warmups: dict[str, Measure] | None = None


def run_case(name: str, unit: str, subject: str, series: dict[str, Measure], reps: int, warmup: int = 1,
             higher_is_better: bool = True, warmups: dict[str, Measure] | None = None) -> CaseResult:
    """`run_cases` for one case."""
    return run_cases([CaseSpec(name, unit, subject, series, higher_is_better, warmups)], reps, warmup)[0]


def run_cases(specs: list[CaseSpec], reps: int, warmup: int = 1) -> list[CaseResult]:
    """Measure every series of every case `reps` times after `warmup` unrecorded runs. A repetition
    measures each case once (cases in rotated order) and within it each engine (rotated too), so a
    noisy neighbour on a shared machine, or a machine that slows down for a while, hits every engine
    and every case alike: a target that compares two cases of one engine (B=8 against B=1) is then
    not moved by when each case happened to run. Sample i of every series is from repetition i."""
    for w in range(warmup):
        for c in specs:
            for n in c.series:
                log(f"{c.name}: warm-up {n}")
                (c.warmups or {}).get(n, c.series[n])()
    values = [{n: [] for n in c.series} for c in specs]
    extras: list[dict[str, dict[str, list[float]]]] = [{n: {} for n in c.series} for c in specs]
    for r in range(reps):
        for ci in rotate(range(len(specs)), r):
            c = specs[ci]
            for n in rotate(list(c.series), r):
                smp = c.series[n]()
                values[ci][n].append(smp.value)
                for k, v in smp.extras.items():
                    extras[ci][n].setdefault(k, []).append(v)
                log(f"{c.name}: rep {r + 1}/{reps} {n} = {smp.value:.2f} {c.unit}")
    out = []
    for c, vals, ex in zip(specs, values, extras):
        case = CaseResult(c.name, c.unit, c.subject, c.higher_is_better)
        case.results = {n: summarize(v) for n, v in vals.items() if v}
        case.extras = {n: {k: summarize(v).median for k, v in e.items()} for n, e in ex.items() if e}
        out.append(case)
    return out
