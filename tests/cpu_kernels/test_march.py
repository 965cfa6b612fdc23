"""AUGURY_CPU_MARCH: a build for another -march target (cpu_kernels/build.py).

The kernels pick their SIMD paths at compile time (-march=native), so a CI machine with AVX-512 never
ran the AVX2 paths, which every AVX2-only host runs. Here an AVX-512 host builds the x86-64-v3 (AVX2)
library in a child process and runs this folder's kernel tests against it: the AVX2 products,
attention, argmax and the decoder layer, checked bit for bit against their references there."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from augury.cpu_kernels import build

_HERE = Path(__file__).parent


def test_march_names_its_own_library(monkeypatch) -> None:
    monkeypatch.delenv(build._MARCH_ENV, raising=False)
    assert build._name() == "augury_cpu_kernels"
    monkeypatch.setenv(build._MARCH_ENV, "native")
    assert build._name() == "augury_cpu_kernels"
    monkeypatch.setenv(build._MARCH_ENV, "x86-64-v3")
    assert build._name() == "augury_cpu_kernels_x86_64_v3"
    if platform.machine().lower() in ("x86_64", "amd64") and sys.platform != "win32":
        assert "-march=x86-64-v3" in build._flags()


def test_a_bad_march_is_an_error_naming_the_variable(monkeypatch) -> None:
    monkeypatch.setenv(build._MARCH_ENV, "x86-64 -fplugin=evil.so")
    with pytest.raises(ValueError, match="AUGURY_CPU_MARCH"):
        build._flags()


def _avx512_host() -> bool:
    if sys.platform != "linux" or platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    return " avx512f " in Path("/proc/cpuinfo").read_text()


@pytest.mark.timeout(1800)
@pytest.mark.skipif(not _avx512_host(), reason="not an AVX-512 x86 Linux host: its native build already runs the AVX2 paths")
@pytest.mark.skipif(bool(os.environ.get(build._MARCH_ENV)), reason="already the child run")
def test_the_avx2_paths_on_an_avx512_host(native) -> None:
    env = dict(os.environ, **{build._MARCH_ENV: "x86-64-v3"})
    isa = subprocess.run(
        [sys.executable, "-c", "import torch; from augury.cpu_kernels import load; assert load(); "
                               "print(torch.ops.augury_cpu.int4_isa())"],
        env=env, capture_output=True, text=True, timeout=900)
    assert isa.returncode == 0, isa.stderr[-2000:]
    assert isa.stdout.strip().splitlines()[-1] == "avx2"
    tests = sorted(str(p) for p in _HERE.glob("test_*.py") if p.name != Path(__file__).name)
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *tests],
                         env=env, capture_output=True, text=True, timeout=1500, cwd=_HERE.parent.parent)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
