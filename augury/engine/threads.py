"""Keep CPU parallelism in one long-lived thread: heavy set-up runs in a thread that exits.

torch's CPU ops run their parallel regions on libgomp (OpenMP). libgomp gives every
thread that starts a parallel region its own pool of worker threads and keeps that
pool until the thread exits. Once the process holds more pooled OpenMP threads than
it has CPUs, libgomp stops letting idle workers spin between regions ("throttled"
spinning): every region then wakes its workers through the kernel. A decode step runs
a few hundred small parallel regions, so on 2 cores a SmolLM2 step measured 14 ms
instead of 8.5 ms when the main thread had loaded the model (and so owned a pool)
while the engine thread ran the steps.

So the engine does its heavy start-up (loading, quantizing, calibrating) in a
short-lived thread: when that thread exits its pool goes with it, and the engine
thread is the only one left holding workers.
"""

from __future__ import annotations

import threading
from typing import Callable, TypeVar

T = TypeVar("T")


def run_in_fresh_thread(fn: Callable[[], T], name: str = "augury-setup") -> T:
    """fn() in a new thread that exits when it returns; its result, or its exception re-raised."""
    box: dict[str, object] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:  # re-raised in the caller, with its own traceback
            box["error"] = e

    t = threading.Thread(target=target, name=name, daemon=True)
    t.start()
    t.join()
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box["value"]  # type: ignore[return-value]
