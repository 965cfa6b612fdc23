"""Crash consistency: a writer process killed at random points never leaves a file that is
later served wrong; torn temp files of dead writers are cleaned at start-up."""

from __future__ import annotations

import os
import random
import signal
import sys
import time

import numpy as np
import pytest
import torch

from augury.cache.ssd_store import SSDStore

NS = "crash-model:tok:float32:native"
N_FLOATS = 2048  # 8 KiB blocks: many writes per millisecond window


def expected(i: int) -> torch.Tensor:
    return torch.from_numpy(np.arange(N_FLOATS, dtype=np.float32) * 0.5 + i)


def _child(root: str, base: int) -> None:
    s = SSDStore(root, 2 << 20, max_pending_bytes=1 << 30)  # small budget: eviction runs while killed
    for j in range(400):
        s.put(NS, "full", (base + j).to_bytes(16, "little"), [j] * 4, expected(base + j))
    s.flush()


@pytest.mark.slow
@pytest.mark.skipif(sys.platform == "win32", reason="needs fork")
def test_kill_during_write_never_serves_a_bad_file(tmp_path):
    rng = random.Random(1234)
    root = str(tmp_path)
    trials, served, killed_mid = 60, 0, 0
    for trial in range(trials):
        pid = os.fork()
        if pid == 0:  # child: write until killed
            try:
                _child(root, trial * 1000)
            finally:
                os._exit(0)
        time.sleep(rng.uniform(0.0, 0.04))
        os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        killed_mid += os.WIFSIGNALED(status)
        if rng.random() < 0.3:  # also simulate a torn tail on a finished file (bit rot / bad disk)
            done = [os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs if f.endswith(".akv")]
            if done:
                victim = rng.choice(done)
                size = os.path.getsize(victim)
                with open(victim, "r+b") as f:
                    f.truncate(rng.randrange(0, size))
        s = SSDStore(root, 1 << 30)
        leftovers = [f for _, _, fs in os.walk(root) for f in fs if ".tmp." in f]
        assert leftovers == [], "a dead writer's temp file survived start-up"
        for d, _, fs in os.walk(root):
            for f in fs:
                i = int.from_bytes(bytes.fromhex(f.split(".")[0]), "little")
                t = s.get(NS, "full", i.to_bytes(16, "little"))
                if t is not None:
                    served += 1
                    assert torch.equal(t, expected(i)), f"block {i} served with wrong bytes"
        s.close()
    assert killed_mid >= 50  # the kills really landed while the writer was running
    assert served > 0
