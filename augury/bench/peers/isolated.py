"""Run a peer in a process of its own, so no two engines share one OpenMP runtime.

torch and llama.cpp (ggml) both run their CPU parallel regions on libgomp, and in one
process they load the same copy. libgomp keeps a worker pool per thread that ever ran
a parallel region, and once the process holds more pooled threads than CPUs it stops
letting idle workers spin between regions (see augury/engine/threads.py). Measured on
2 cores: llama.cpp decoded SmolLM2 at ~150 tok/s alone and ~95 tok/s in a process where
augury's engine thread also held a pool; augury lost as much the other way. So each
peer lives in a child process (spawned: no inherited threads or OpenMP state), and the
harness talks to it over a pipe. Timings are taken inside the child, as before.
"""

from __future__ import annotations

import importlib
import multiprocessing as mp
from typing import Any, Sequence

from augury.bench.peers.base import BatchTiming, GenTiming, PeerUnavailable


def _resolve(target: str) -> Any:
    """'package.module:Class.method' -> the callable."""
    mod, _, attr = target.partition(":")
    obj: Any = importlib.import_module(mod)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def _serve(conn: Any, target: str, args: tuple, kwargs: dict, threads: int | None) -> None:
    """The child: build the peer, say its name (or why it cannot run), then answer calls."""
    if threads:
        import torch

        torch.set_num_threads(threads)
    try:
        peer = _resolve(target)(*args, **kwargs)
    except PeerUnavailable as e:
        conn.send(("unavailable", str(e)))
        return
    except Exception as e:  # a broken peer is a skipped peer, with the reason
        conn.send(("unavailable", f"{type(e).__name__}: {e}"))
        return
    conn.send(("ok", peer.name))
    while True:
        try:
            method, margs, mkwargs = conn.recv()
        except EOFError:  # the harness went away
            break
        try:
            result = getattr(peer, method)(*margs, **mkwargs)
            conn.send(("ok", result))
        except Exception as e:
            conn.send(("error", f"{type(e).__name__}: {e}"))
        if method == "close":
            break


class IsolatedPeer:
    """A Peer proxy: `target(*args, **kwargs)` builds the real peer inside a spawned child."""

    def __init__(self, target: str, *args: Any, threads: int | None = None, **kwargs: Any) -> None:
        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_serve, args=(child, target, args, kwargs, threads), daemon=True)
        self._proc.start()
        child.close()
        try:
            status, payload = self._conn.recv()
        except EOFError:
            self._proc.join(timeout=5)
            raise PeerUnavailable(f"the peer process for {target} exited while loading "
                                  f"(exit code {self._proc.exitcode})") from None
        if status != "ok":
            self._proc.join(timeout=5)
            raise PeerUnavailable(payload)
        self.name: str = payload

    def _call(self, _name: str, *args: Any, **kwargs: Any) -> Any:
        self._conn.send((_name, args, kwargs))
        try:
            status, payload = self._conn.recv()
        except EOFError:
            raise RuntimeError(f"peer {self.name}: its process died (exit code {self._proc.exitcode})") from None
        if status != "ok":
            raise RuntimeError(f"peer {self.name}: {payload}")
        return payload

    def generate(self, ids: Sequence[int], max_tokens: int, ignore_eos: bool = True,
                 method: str | None = None) -> GenTiming:
        return self._call("generate", list(ids), max_tokens, ignore_eos=ignore_eos, method=method)

    def generate_batch(self, prompts: Sequence[Sequence[int]], max_tokens: int) -> BatchTiming | None:
        return self._call("generate_batch", [list(p) for p in prompts], max_tokens)

    def close(self) -> None:
        if self._proc.is_alive():
            try:
                self._call("close")
            except (RuntimeError, OSError, BrokenPipeError):
                pass
        self._conn.close()
        self._proc.join(timeout=10)
        if self._proc.is_alive():
            self._proc.kill()
