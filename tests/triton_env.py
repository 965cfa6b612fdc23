"""Triton test modules: turn the interpreter on (CPU) before triton is first imported.

Call `interpreter()` at the top of a test module, before importing any kernel module:
it skips the module without triton, sets TRITON_INTERPRET=1 on a CPU-only machine and
says whether this process can run the checks. Triton decorates its own library at first
import, so if something imported it earlier with the interpreter off, the module's
checks run in a fresh process instead (`rerun_in_fresh_process`).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest
import torch


def interpreter() -> tuple[bool, bool]:
    """-> (cpu_only, fresh): fresh = this process can run the kernels."""
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed", allow_module_level=True)
    cpu = not torch.cuda.is_available()
    fresh = not cpu or "triton" not in sys.modules or os.environ.get("TRITON_INTERPRET") == "1"
    if cpu:
        os.environ["TRITON_INTERPRET"] = "1"
    return cpu, fresh


def rerun_in_fresh_process(path: str, timeout: int = 900) -> None:
    """Run one test file in a new interpreter-on process; fail with its output."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", path],
                       env=env, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
