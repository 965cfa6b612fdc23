"""Compile augury's C++ CPU kernels once per machine and register them as `torch.ops.augury_cpu.*`.

Built with torch's extension builder (`torch.utils.cpp_extension.load`: ninja and a C++ compiler;
the result is cached under `TORCH_EXTENSIONS_DIR`, default ~/.cache/torch_extensions, and rebuilt when
a source changes). The first build takes about a minute and prints a line saying so; later starts
load the cached library in well under a second.

`-march=native`: the library is built on the machine that runs it, so it may use every SIMD
extension that machine has (the int4 kernel has an AVX-512 VNNI path, an AVX2 path and a portable one).
`AUGURY_CPU_MARCH=x86-64-v3` (any gcc `-march` value) builds for that target instead, as a library
of its own name: on an AVX-512 machine this builds and runs the AVX2 paths, which is how the tests
check those paths' bits on such machines (tests/cpu_kernels/test_march.py), and how to measure them.

When the build is impossible (no compiler, no ninja, an unsupported platform) or disabled with
`AUGURY_CPU_KERNELS=0`, `load()` returns False, `unavailable_reason()` says why, and every caller
keeps torch's own kernels: slower, never wrong.
"""

from __future__ import annotations

import logging
import os
import platform
import re
import sys
import threading
from pathlib import Path

import torch

log = logging.getLogger(__name__)

_NAME = "augury_cpu_kernels"
_MARCH_ENV = "AUGURY_CPU_MARCH"
_lock = threading.Lock()
# the outcome, once known: a plain global, so the per-layer `load()` calls (eager steps, and compiled
# graphs, which trace it) read one value and take no lock
_ok: bool | None = None
_why: str | None = None


def _march() -> str | None:
    """The `-march` target AUGURY_CPU_MARCH asks for (None: native); a value gcc could not take as one
    word is an error that names the variable."""
    m = os.environ.get(_MARCH_ENV, "").strip()
    if not m or m == "native":
        return None
    if not re.fullmatch(r"[A-Za-z0-9_.+-]+", m):
        raise ValueError(f"{_MARCH_ENV}={m!r} is not a -march value (e.g. x86-64-v3, skylake-avx512, native)")
    return m


def _name() -> str:
    """The library's name: a non-native target gets its own, so the two builds never replace each other."""
    m = _march()
    return _NAME if m is None else f"{_NAME}_{re.sub(r'[^A-Za-z0-9]', '_', m)}"


def _flags() -> list[str]:
    if sys.platform == "win32":
        return ["/O2", "/openmp"]
    # -ffp-contract=off: a multiply and an add stay two roundings, as in torch's elementwise ops
    # (decoder_layer.cpp reproduces them bit for bit); the kernels fuse where they mean to, with intrinsics
    flags = ["-O3", "-fopenmp", "-ffp-contract=off"]
    if platform.machine().lower() in ("x86_64", "amd64"):
        flags.append(f"-march={_march() or 'native'}")
    elif platform.machine().lower() in ("arm64", "aarch64"):
        flags.append("-mcpu=native")
    return flags


def _headers_digest(here: Path) -> str:
    import hashlib

    h = hashlib.sha256()
    for p in sorted(here.glob("*.h")):
        h.update(p.read_bytes())
    return h.hexdigest()[:16]


def load() -> bool:
    """Build (first time on this machine) or load the kernels; True when `torch.ops.augury_cpu` has them."""
    global _ok, _why
    if _ok is not None:
        return _ok
    with _lock:
        if _ok is None:
            ok, why = _build()
            if ok:
                _register_shape_functions()
            else:
                log.warning("augury CPU kernels unavailable (%s): using torch's kernels", why)
            _ok, _why = ok, why
        return _ok


def _register_shape_functions() -> None:
    """What each op returns, for torch.compile's tracing (the ops themselves are opaque to it)."""

    @torch.library.register_fake("augury_cpu::int4_mm")
    def _(x, packed, scales, group_size):  # noqa: ANN001 - torch's fake-tensor signature
        return x.new_empty((x.shape[0], packed.shape[0] * packed.shape[2] // 16))  # 16 rows x 16 bytes per tile

    @torch.library.register_fake("augury_cpu::rms_norm")
    def _(x, eps):  # noqa: ANN001
        return torch.empty_like(x)

    @torch.library.register_fake("augury_cpu::int8_mm")
    def _(x, w, scales):  # noqa: ANN001
        return x.new_empty((x.shape[0], w.shape[0]))

    @torch.library.register_fake("augury_cpu::argmax_rows")
    def _(x):  # noqa: ANN001
        return x.new_empty((x.shape[0],), dtype=torch.long)

    @torch.library.register_fake("augury_cpu::paged_attention_rows")
    def _(q, k_pool, v_pool, gather_slots, rows, scale, parallel):  # noqa: ANN001
        return torch.empty_like(q)


def available() -> bool:
    """Whether the kernels are loaded (without trying to build them)."""
    return bool(_ok)


def unavailable_reason() -> str | None:
    return None if _ok is not False else _why


def _ninja_on_path() -> None:
    """The `ninja` PyPI package (a dependency) puts its binary in a venv's bin folder, which is not on
    PATH when the venv's python is run without activating it: add it for torch's builder."""
    try:
        import ninja
    except ImportError:
        return
    bin_dir = str(getattr(ninja, "BIN_DIR", ""))
    if bin_dir and bin_dir not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = bin_dir + os.pathsep + os.environ.get("PATH", "")


def _build() -> tuple[bool, str]:
    if os.environ.get("AUGURY_CPU_KERNELS", "1") == "0":
        return False, "disabled by AUGURY_CPU_KERNELS=0"
    try:
        from torch.utils import cpp_extension
    except ImportError as e:  # pragma: no cover - part of every torch
        return False, f"torch.utils.cpp_extension: {e}"
    try:
        name, flags = _name(), _flags()
    except ValueError as e:
        return False, str(e)
    here = Path(__file__).parent
    _ninja_on_path()
    try:
        cpp_extension.verify_ninja_availability()
    except RuntimeError:
        return False, "ninja is not installed (pip install ninja)"
    build_dir = Path(cpp_extension._get_build_directory(name, verbose=False))
    if not any(build_dir.glob("*.so")) and not any(build_dir.glob("*.pyd")):
        print("augury: building the native CPU kernels (once per machine, 10-60 s)...", file=sys.stderr,
              flush=True)
    try:
        cpp_extension.load(
            name=name,
            sources=sorted(str(p) for p in here.glob("*.cpp")),  # every kernel file: one library
            # the shared header is not in torch's rebuild hash: its digest in a define puts it there
            extra_cflags=flags + [f"-DAUGURY_HEADERS={_headers_digest(here)}"],
            extra_ldflags=[] if sys.platform == "win32" else ["-fopenmp"],
            is_python_module=False,
            verbose=False,
        )
    except Exception as e:  # compiler missing or failing: keep torch's kernels
        first = str(e).strip().splitlines()
        return False, f"build failed: {first[0] if first else type(e).__name__}"
    return hasattr(torch.ops.augury_cpu, "int4_mm"), "ops missing after load"


def build_dir() -> Path:
    from torch.utils import cpp_extension
    return Path(cpp_extension._get_build_directory(_name(), verbose=False))
