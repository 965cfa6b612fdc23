"""The native kernels must build wherever a C++ compiler and ninja exist (CI has both): a build
failure there is a test failure, not a skip."""

from __future__ import annotations

import shutil
import sys

import pytest

from augury.cpu_kernels import load, unavailable_reason


def _toolchain() -> bool:
    return sys.platform != "win32" and bool(shutil.which("c++") or shutil.which("g++")) and bool(shutil.which("ninja") or _ninja_pkg())


def _ninja_pkg() -> bool:
    try:
        import ninja  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.fixture(scope="session")
def native() -> None:
    if not load():
        if _toolchain() and "AUGURY_CPU_KERNELS=0" not in str(unavailable_reason()):
            pytest.fail(f"native CPU kernels failed to build with a toolchain present: {unavailable_reason()}")
        pytest.skip(f"native CPU kernels unavailable: {unavailable_reason()}")
