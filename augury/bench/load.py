"""Load augury and the requested peers for a scenario; a peer that cannot run is skipped with its reason."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import torch

from augury.bench.model_facts import gguf_facts
from augury.bench.options import BenchOptions
from augury.bench.peers.augury_peer import AuguryPeer
from augury.bench.peers.base import Peer, PeerUnavailable
from augury.bench.peers import same_bits
from augury.bench.peers.isolated import IsolatedPeer
from augury.bench.runner import log
from augury.bench.scenarios import Limit, Setup


# peers run in child processes (augury/bench/peers/isolated.py says why); these build them there
LLAMA_CPP = "augury.bench.peers.llamacpp_peer:LlamaCppPeer.load"
HF = "augury.bench.peers.hf_peer:HFPeer.load"
# where decode reads every weight once a token, so the head's bits move the result (peers/same_bits.py)
SAME_BITS_SCENARIOS = ("decode", "batch")


def model_path(opts: BenchOptions) -> Path:
    from augury.weights.registry import resolve_model

    return resolve_model(opts.model)


def load_peer(name: str, loader: Callable[[], Peer], skipped: dict[str, str]) -> Peer | None:
    """Run a peer's loader; on PeerUnavailable note why and carry on without it."""
    try:
        return loader()
    except PeerUnavailable as e:
        log(f"skipping peer {name}: {e}")
        skipped[name] = str(e)
        return None


def _needs_copy(path: Path, skipped: dict[str, str]) -> bool:
    """Whether to add the same-bytes llama.cpp peer; a file gguf cannot read skips it with the reason."""
    try:
        return same_bits.needs_copy(path)
    except Exception as e:  # noqa: BLE001 - a peer that cannot be set up is a skipped peer
        skipped["llama.cpp-q4head"] = f"reading {path.name}: {type(e).__name__}: {e}"
        return False


def augury_kwargs(opts: BenchOptions, scenario: str) -> dict:
    kw: dict = dict(device=opts.device, dtype=opts.dtype, weights=opts.weights, threads=opts.threads,
                    kv_budget=opts.kv_budget, compile=opts.compile)
    if scenario == "batch":
        kw["max_num_seqs"] = max(opts.batch_sizes)
    if scenario == "spec" and "layerskip" in opts.spec_methods:
        kw.update(spec="layerskip", spec_layers=opts.spec_layers)
    return kw


def build_setup(opts: BenchOptions, scenario: str) -> Setup:
    torch.set_num_threads(opts.threads)
    path = model_path(opts)
    log(f"loading augury ({opts.model}, weights {opts.weights}, {opts.threads} threads)")
    aug = AuguryPeer.load(opts.model, **augury_kwargs(opts, scenario))
    tok = aug.engine.tokenizer
    eos = list(aug.engine.loaded.eos_token_ids)
    skipped: dict[str, str] = {}
    peers: dict[str, Peer] = {}
    is_gguf = path.suffix.lower() == ".gguf"
    if "llama.cpp" in opts.peers:
        log(f"loading llama.cpp on {path.name} (in a process of its own)")
        p = load_peer("llama.cpp", lambda: IsolatedPeer(LLAMA_CPP, path, eos, opts.threads), skipped)
        if p:
            peers[p.name] = p
            if scenario in SAME_BITS_SCENARIOS and opts.weights == "int4" and is_gguf and _needs_copy(path, skipped):
                log(f"loading llama.cpp on a copy of {path.name} with the head at the layers' bits (augury's int4 head)")
                q = load_peer("llama.cpp-q4head",
                              lambda: IsolatedPeer(LLAMA_CPP, path, eos, opts.threads, same_bits=True), skipped)
                if q:
                    peers[q.name] = q
            if scenario == "spec":
                for k in opts.pld_tokens:
                    q = load_peer(f"llama.cpp-pld{k}",
                                  lambda k=k: IsolatedPeer(LLAMA_CPP, path, eos, opts.threads, prompt_lookup=k),
                                  skipped)
                    if q:
                        peers[q.name] = q
    if "hf" in opts.peers and scenario != "spec":
        log(f"loading HF transformers on {path.name} (fp32, in a process of its own; dequantizing takes a while)")
        p = load_peer("hf", lambda: IsolatedPeer(HF, path, eos, opts.threads, threads=opts.threads), skipped)
        if p:
            peers[p.name] = p
    limit = None
    if "limit" in opts.peers and scenario != "spec":
        if is_gguf:
            limit = Limit(gguf_facts(path), aug.engine.loaded.device)
        else:
            skipped["limit"] = "the physical limit is computed from a GGUF file's tensor sizes"
    return Setup(opts, aug, tok, peers, limit, skipped)


def close_setup(s: Setup) -> None:
    for p in [s.augury, *s.peers.values()]:
        try:
            p.close()
        except Exception:  # closing is best effort at exit
            pass
