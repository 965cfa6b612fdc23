"""Results of a scenario: the JSON object `augury bench --json` prints, and its markdown table."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from augury.bench.stats import Summary, case_ratios

SCHEMA_VERSION = 1


@dataclass
class CaseResult:
    """One measured case of a scenario (e.g. 'prompt 1k' or 'B=16')."""

    name: str
    unit: str  # "tok/s" or "ms"
    subject: str  # the augury series the ratios are computed for
    higher_is_better: bool = True
    results: dict[str, Summary] = field(default_factory=dict)
    # per series extra figures (median over reps), e.g. mean accepted length
    extras: dict[str, dict[str, float]] = field(default_factory=dict)

    @property
    def ratios(self) -> dict[str, float | None]:
        med = {k: v.median for k, v in self.results.items()}
        return case_ratios(med, self.subject, self.higher_is_better)

    def as_dict(self) -> dict:
        return {
            "case": self.name, "unit": self.unit, "subject": self.subject,
            "higher_is_better": self.higher_is_better,
            "results": {k: v.as_dict() for k, v in self.results.items()},
            "ratios": self.ratios,
            "extras": self.extras,
        }


@dataclass
class Target:
    """An issue target checked against the measured medians."""

    name: str
    value: float | None
    goal: float

    @property
    def met(self) -> bool | None:
        return None if self.value is None else self.value >= self.goal

    def as_dict(self) -> dict:
        return {"target": self.name, "value": self.value, "goal": self.goal, "met": self.met}


@dataclass
class ScenarioReport:
    scenario: str
    headline: str  # the case whose ratios are the report's top-level `ratios`
    cases: list[CaseResult]
    config: dict[str, Any] = field(default_factory=dict)
    machine: dict[str, Any] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)  # peer -> why it did not run
    targets: list[Target] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def case(self, name: str) -> CaseResult | None:
        return next((c for c in self.cases if c.name == name), None)

    @property
    def ratios(self) -> dict[str, float | None]:
        c = self.case(self.headline) or (self.cases[0] if self.cases else None)
        return c.ratios if c else {}

    def as_dict(self) -> dict:
        return {
            "schema": SCHEMA_VERSION,
            "scenario": self.scenario,
            "headline": self.headline,
            "ratios": self.ratios,
            "cases": [c.as_dict() for c in self.cases],
            "targets": [t.as_dict() for t in self.targets],
            "skipped": self.skipped,
            "config": self.config,
            "machine": self.machine,
            "notes": self.notes,
        }

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), indent=None, default=str)


def _fmt(x: float | None, unit: str = "") -> str:
    if x is None:
        return "—"
    if unit == "ms" or abs(x) >= 100:
        return f"{x:.0f}"
    return f"{x:.1f}" if abs(x) >= 10 else f"{x:.2f}"


def render_table(rep: ScenarioReport) -> str:
    """Markdown: one row per (case, series) with median [min–max] and the subject's ratio to it."""
    lines = [f"### {rep.scenario}", "",
             "| case | engine | median | min–max | n | augury ratio |", "|---|---|---:|---:|---:|---:|"]
    for c in rep.cases:
        ratios = c.ratios
        for name, s in c.results.items():
            r = "(subject)" if name == c.subject else (_fmt(ratios.get(name)) + "×" if ratios.get(name) else "—")
            extra = c.extras.get(name)
            label = name + (" (" + ", ".join(f"{k} {_fmt(v)}" for k, v in extra.items()) + ")" if extra else "")
            lines.append(f"| {c.name} | {label} | {_fmt(s.median, c.unit)} {c.unit} | "
                         f"{_fmt(s.min, c.unit)}–{_fmt(s.max, c.unit)} | {s.n} | {r} |")
    if rep.targets:
        lines += ["", "| target | measured | goal | met |", "|---|---:|---:|---|"]
        for t in rep.targets:
            lines.append(f"| {t.name} | {_fmt(t.value)} | {t.goal:g} | "
                         f"{'yes' if t.met else ('no' if t.met is False else '—')} |")
    for peer, why in rep.skipped.items():
        lines.append(f"\n_skipped {peer}: {why}_")
    for n in rep.notes:
        lines.append(f"\n_{n}_")
    return "\n".join(lines) + "\n"


def write_outputs(rep: ScenarioReport, out_dir: Path, plot: bool = True) -> dict[str, Path]:
    """Write <scenario>.json, <scenario>.md and (when matplotlib is there) <scenario>.png."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": out_dir / f"{rep.scenario}.json", "md": out_dir / f"{rep.scenario}.md"}
    paths["json"].write_text(json.dumps(rep.as_dict(), indent=1, default=str) + "\n")
    paths["md"].write_text(render_table(rep))
    if plot:
        from augury.bench.plot import plot_report

        png = plot_report(rep, out_dir / f"{rep.scenario}.png")
        if png is not None:
            paths["png"] = png
    return paths
