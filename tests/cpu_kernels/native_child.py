"""Run a native op in a child process with other environment variables (switches the kernels read once
per process, like the software-prefetch hints) and return its outputs, to compare bit for bit."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

_CHILD = r"""
import importlib, sys, torch
from augury.cpu_kernels import load
assert load()
mod, _, attr = sys.argv[3].partition(":")
fn = importlib.import_module(mod)
for part in attr.split("."):
    fn = getattr(fn, part)
torch.save([fn(*a) for a in torch.load(sys.argv[1])], sys.argv[2])
"""


def outputs_in_child(fn: str, calls: list[tuple], env: dict[str, str], tmp: Path) -> list:
    """fn: "module:attr.path" (e.g. "torch:ops.augury_cpu.paged_attention_rows"); calls: argument tuples."""
    import torch

    torch.save(calls, tmp / "in.pt")
    subprocess.run([sys.executable, "-c", _CHILD, str(tmp / "in.pt"), str(tmp / "out.pt"), fn],
                   check=True, env=dict(os.environ, **env), timeout=600)
    return torch.load(tmp / "out.pt")
