"""PNG plot of a scenario: per case, grouped bars of each engine's median with min–max whiskers."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from augury.bench.report import ScenarioReport


def plot_report(rep: "ScenarioReport", path: Path) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")  # no display on servers
        import matplotlib.pyplot as plt
    except ImportError:
        print("augury bench: matplotlib is not installed (pip install 'augury[bench]'); no plot written",
              file=sys.stderr)
        return None
    cases = [c for c in rep.cases if c.results]
    if not cases:
        return None
    ncol = min(len(cases), 3)
    nrow = (len(cases) + ncol - 1) // ncol
    fig, axes = plt.subplots(nrow, ncol, figsize=(4.2 * ncol, 3.2 * nrow), squeeze=False)
    for ax, c in zip(axes.flat, cases):
        names = list(c.results)
        med = [c.results[n].median for n in names]
        lo = [m - c.results[n].min for m, n in zip(med, names)]
        hi = [c.results[n].max - m for m, n in zip(med, names)]
        colors = ["#d62728" if n == c.subject else ("#7f7f7f" if n == "limit" else "#1f77b4") for n in names]
        ax.bar(range(len(names)), med, yerr=[lo, hi], color=colors, capsize=3)
        ax.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize=7)
        ax.set_title(c.name, fontsize=9)
        ax.set_ylabel(c.unit, fontsize=8)
        ax.tick_params(axis="y", labelsize=7)
        if "limit" in c.results and len(names) > 1:
            # the physical limit can dwarf the engines: log scale keeps them readable
            ax.set_yscale("log")
    for ax in list(axes.flat)[len(cases):]:
        ax.axis("off")
    fig.suptitle(f"augury bench {rep.scenario} — {rep.config.get('model', '')} "
                 f"{rep.config.get('weights', '')} @ {rep.machine.get('revision', '')}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path
