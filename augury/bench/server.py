"""The server scenario: `augury serve` against llama-cpp-python's own server on the same GGUF,
both as subprocesses, measured by the same streaming OpenAI clients."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import torch

from augury.bench.load import augury_kwargs, model_path
from augury.bench.machine import machine_info
from augury.bench.options import BenchOptions
from augury.bench.peers.augury_peer import AuguryPeer
from augury.bench.peers.base import PeerUnavailable
from augury.bench.peers.llamacpp_peer import import_llama_cpp
from augury.bench.report import ScenarioReport
from augury.bench.runner import Measure, Sample, log, run_case

SHORT_CHAT = [{"role": "user", "content": "Hi! How are you today?"}]
LONG_CHAT = [{"role": "user", "content": "Write a long story about a dragon who guards a library."}]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class ServerProc:
    name: str
    base: str
    proc: subprocess.Popen
    log_path: Path
    model: str = ""

    @classmethod
    def start(cls, name: str, cmd: list[str], port: int, ready_path: str, log_dir: Path,
              timeout: float = 300.0) -> "ServerProc":
        log_dir.mkdir(parents=True, exist_ok=True)
        lp = log_dir / f"{name}.server.log"
        proc = subprocess.Popen(cmd, stdout=lp.open("w"), stderr=subprocess.STDOUT)
        base = f"http://127.0.0.1:{port}"
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if proc.poll() is not None:
                raise PeerUnavailable(f"{name} server exited with {proc.returncode}; see {lp}")
            try:
                if httpx.get(base + ready_path, timeout=2.0).status_code == 200:
                    models = httpx.get(base + "/v1/models", timeout=10.0).json().get("data") or [{}]
                    return cls(name, base, proc, lp, str(models[0].get("id", "")))
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        proc.terminate()
        raise PeerUnavailable(f"{name} server not ready after {timeout:.0f}s; see {lp}")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()


@dataclass
class StreamTiming:
    ttft_s: float
    last_s: float
    tokens: int

    @property
    def decode_rate(self) -> float:
        dt = self.last_s - self.ttft_s
        return (self.tokens - 1) / dt if self.tokens > 1 and dt > 0 else 0.0


async def stream_chat(client: httpx.AsyncClient, srv: ServerProc, messages: list[dict], max_tokens: int,
                      bias: dict[str, float]) -> StreamTiming:
    """One streaming chat completion; tokens from usage when the server sends it, else content chunks."""
    base = srv.base
    body = {"model": srv.model, "messages": messages, "max_tokens": max_tokens, "temperature": 0.0, "stream": True,
            "logit_bias": bias, "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    ttft, last, chunks, usage = 0.0, 0.0, 0, None
    async with client.stream("POST", base + "/v1/chat/completions", json=body, timeout=600.0) as r:
        if r.status_code != 200:
            raise RuntimeError(f"{base}: HTTP {r.status_code}: {(await r.aread())[:300]!r}")
        async for line in r.aiter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            obj = json.loads(data)
            if obj.get("usage"):
                usage = obj["usage"]
            for ch in obj.get("choices") or []:
                if (ch.get("delta") or {}).get("content"):
                    now = time.perf_counter() - t0
                    chunks += 1
                    ttft = ttft or now
                    last = now
    n = int(usage["completion_tokens"]) if usage and usage.get("completion_tokens") else chunks
    return StreamTiming(ttft, last, n)


async def _clients(srv: ServerProc, n: int, max_tokens: int, bias: dict[str, float]) -> Sample:
    async with httpx.AsyncClient() as c:
        t0 = time.perf_counter()
        res = await asyncio.gather(*[stream_chat(c, srv, LONG_CHAT, max_tokens, bias) for _ in range(n)])
        wall = time.perf_counter() - t0
    return Sample(sum(r.tokens for r in res) / wall)


def _ttft(srv: ServerProc, bias: dict[str, float]) -> Sample:
    async def go() -> StreamTiming:
        async with httpx.AsyncClient() as c:
            return await stream_chat(c, srv, SHORT_CHAT, 8, bias)
    return Sample(asyncio.run(go()).ttft_s * 1000)


def _decode(srv: ServerProc, max_tokens: int, bias: dict[str, float]) -> Sample:
    async def go() -> StreamTiming:
        async with httpx.AsyncClient() as c:
            return await stream_chat(c, srv, LONG_CHAT, max_tokens, bias)
    return Sample(asyncio.run(go()).decode_rate)


def run_server_scenario(opts: BenchOptions) -> ScenarioReport:
    torch.set_num_threads(opts.threads)
    machine = machine_info(torch.device(opts.device), opts.threads)  # the revision the run started on
    path = model_path(opts)
    t = str(opts.threads)
    skipped: dict[str, str] = {}
    servers: dict[str, ServerProc] = {}
    log_dir = Path(opts.out)
    max_batch = str(max(16, *opts.server_clients))
    log("starting augury serve")
    servers["augury-server"] = ServerProc.start(
        "augury-server",
        [sys.executable, "-m", "augury", "serve", "--model", opts.model, "--weights", opts.weights,
         "--dtype", opts.dtype, "--device", opts.device, "--threads", t, "--quiet", "--max-batch", max_batch,
         "--port", str(port := free_port())], port, "/health", log_dir)
    direct = None
    try:
        if "llama.cpp" in opts.peers:
            try:
                import_llama_cpp()
                log("starting python -m llama_cpp.server")
                servers["llama.cpp-server"] = ServerProc.start(
                    "llama.cpp-server",
                    [sys.executable, "-m", "llama_cpp.server", "--model", str(path), "--n_threads", t,
                     "--n_threads_batch", t, "--n_ctx", "4096", "--host", "127.0.0.1",
                     "--port", str(port := free_port())], port, "/v1/models", log_dir)
            except PeerUnavailable as e:
                log(f"skipping peer llama.cpp-server: {e}")
                skipped["llama.cpp-server"] = str(e)
        log("loading augury in-process for the engine-direct rate")
        direct = AuguryPeer.load(opts.model, **augury_kwargs(opts, "server"))
        eos = list(direct.engine.loaded.eos_token_ids)
        bias = {str(e): -100.0 for e in eos}  # every client decodes the full max_tokens on both servers
        chat_ids = direct.engine.tokenizer.encode_chat(LONG_CHAT)
        cases = []
        ttft: dict[str, Measure] = {n: (lambda s=s: _ttft(s, bias)) for n, s in servers.items()}
        cases.append(run_case("warm TTFT, short chat", "ms", "augury-server", ttft, opts.reps, opts.warmup,
                              higher_is_better=False))
        dec: dict[str, Measure] = {n: (lambda s=s: _decode(s, opts.server_tokens, bias))
                                   for n, s in servers.items()}
        dec["augury-engine"] = lambda: Sample(direct.generate(chat_ids, opts.server_tokens, True).decode_rate)
        cases.append(run_case("decode, 1 stream", "tok/s", "augury-server", dec, opts.reps, opts.warmup))
        for n in opts.server_clients:
            agg: dict[str, Measure] = {
                name: (lambda s=s, n=n: asyncio.run(_clients(s, n, opts.server_tokens, bias)))
                for name, s in servers.items()}
            cases.append(run_case(f"{n} clients", "tok/s", "augury-server", agg, opts.reps, opts.warmup))
    finally:
        for s in servers.values():
            s.stop()
        if direct:
            direct.close()
    rep = ScenarioReport("server", f"{opts.server_clients[-1]} clients" if opts.server_clients else cases[0].name,
                         cases, config=opts.engine_dict(), skipped=skipped)
    rep.machine = machine
    rep.notes.append(f"streaming /v1/chat/completions, greedy, EOS suppressed by logit_bias so every stream "
                     f"runs {opts.server_tokens} tokens; aggregate = all tokens / wall time; llama-cpp-python's "
                     "server handles one request at a time")
    return rep
