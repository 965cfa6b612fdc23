"""What the numbers were measured on: revision, CPU, threads, and the hardware's own limits
(memory bandwidth, matmul rate) measured in the same run."""

from __future__ import annotations

import os
import platform
import subprocess
import time
from pathlib import Path

import torch


def revision() -> str:
    """Short git revision of the checkout (with '+dirty' when augury/ has uncommitted changes)."""
    root = Path(__file__).resolve().parents[2]
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True,
                             text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "augury"], cwd=root, capture_output=True,
                               text=True, timeout=10).stdout.strip()
        return (rev + ("+dirty" if dirty else "")) if rev else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info(device: torch.device, threads: int) -> dict:
    info = {
        "revision": revision(),
        "cpu": cpu_name(),
        "cpu_count": os.cpu_count(),
        "threads": threads,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "device": str(device),
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    try:
        import llama_cpp

        info["llama_cpp_python"] = llama_cpp.__version__
    except ImportError:
        pass
    try:
        import transformers

        info["transformers"] = transformers.__version__
    except ImportError:
        pass
    return info


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure_bandwidth(device: torch.device, nbytes: int = 512 << 20, iters: int = 10,
                      dtype: torch.dtype = torch.float32) -> float:
    """Read bandwidth in bytes/s: best of `iters` sums over a tensor far larger than the caches, each
    timed from the host (`device_read_bandwidth` is the GPU benchmarks' warmed, device-timed form)."""
    x = torch.ones(nbytes // dtype.itemsize, dtype=dtype, device=device)
    x.sum()
    _sync(device)
    best = float("inf")
    for _ in range(iters):
        t0 = time.perf_counter()
        x.sum()
        _sync(device)
        best = min(best, time.perf_counter() - t0)
    del x
    return nbytes / best


def device_read_bandwidth(device: torch.device, gib: float = 4.0, warm_s: float = 1.0) -> float:
    """Bytes/s of a reduction over a large bf16 tensor (reads dominate): the best of 8 batches
    of 5 back-to-back sums, timed on the device, after ~warm_s of sums (the GPU benchmarks'
    reading: `roofline`, `kernels_gpu`, `gemv_gpu`).

    The warm-up lets the GPU reach its working clocks (it idles at a few hundred MHz, and a
    reduction timed at once read up to 6% low, by a different amount each run); device-side
    timing keeps the launch and the host's synchronisation out of the figure (~1% of one sum)."""
    n = int(gib * 2**30) // 2
    x = torch.ones(n, dtype=torch.bfloat16, device=device)
    x.sum()
    _sync(device)
    t_end = time.perf_counter() + warm_s
    while time.perf_counter() < t_end:
        for _ in range(10):
            x.sum()
        _sync(device)
    best = float("inf")
    for _ in range(8):
        if device.type == "cuda":
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(5):
                x.sum()
            stop.record()
            stop.synchronize()
            best = min(best, start.elapsed_time(stop) / 1e3 / 5)
        else:
            t = time.perf_counter()
            for _ in range(5):
                x.sum()
            best = min(best, (time.perf_counter() - t) / 5)
    del x
    return n * 2 / best


def measure_matmul(device: torch.device, n: int = 2048, dtype: torch.dtype = torch.float32, iters: int = 10) -> float:
    """Dense matmul rate in FLOP/s (best of `iters`) at the dtype prefill would run in."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    a @ b
    _sync(device)
    best = float("inf")
    for _ in range(iters):
        t0 = time.perf_counter()
        a @ b
        _sync(device)
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best
