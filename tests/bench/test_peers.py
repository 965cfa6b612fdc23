"""Peer-skip paths: a missing package becomes a clear skip message, never a crash."""

import sys

import pytest

from augury.bench.load import load_peer
from augury.bench.peers.base import PeerUnavailable
from augury.bench.peers.llamacpp_peer import LlamaCppPeer


def test_llama_cpp_missing_is_skipped_with_install_hint(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # makes `import llama_cpp` raise ImportError
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    skipped: dict[str, str] = {}
    assert load_peer("llama.cpp", lambda: LlamaCppPeer.load(gguf, [2], threads=2), skipped) is None
    assert "llama_cpp is not importable" in skipped["llama.cpp"]
    assert "pip install llama-cpp-python" in skipped["llama.cpp"]


def test_llama_cpp_needs_a_gguf(tmp_path):
    with pytest.raises(PeerUnavailable, match="needs a .gguf"):
        LlamaCppPeer.load(tmp_path, [2], threads=2)


def test_hf_missing_transformers_is_skipped(monkeypatch, tmp_path):
    from augury.bench.peers.hf_peer import HFPeer

    monkeypatch.setitem(sys.modules, "transformers", None)
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    skipped: dict[str, str] = {}
    assert load_peer("hf", lambda: HFPeer.load(gguf, [2], threads=2), skipped) is None
    assert "transformers is not importable" in skipped["hf"]


def test_other_errors_are_not_swallowed():
    def boom():
        raise RuntimeError("real bug")

    with pytest.raises(RuntimeError):
        load_peer("x", boom, {})


def test_server_scenario_skips_llama_server_without_llama_cpp(monkeypatch):
    from augury.bench import server

    monkeypatch.setitem(sys.modules, "llama_cpp", None)
    with pytest.raises(PeerUnavailable, match="pip install llama-cpp-python"):
        server.import_llama_cpp()
