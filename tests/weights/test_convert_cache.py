"""Converted-weight cache: round trip, exact narrow storage, corruption detection and rebuild."""

from __future__ import annotations

import json
import os
import struct

import pytest
import torch

from augury.weights.convert_cache import cache_path, cached_tensors, narrowest_exact, verify
from augury.weights.loader import load_checkpoint
from tests.weights.gguf_build import tiny_hf_model, write_gguf

FP = "f" * 32


def _source():
    g = torch.Generator().manual_seed(0)
    return {
        "model.embed_tokens.weight": torch.randn(16, 8, generator=g),  # needs fp32
        "model.norm.weight": torch.randn(8, generator=g).to(torch.bfloat16).float(),  # bf16-exact
        "model.layers.0.mlp.up_proj.weight": torch.randint(-8, 8, (4, 8)).float() * 0.5,  # exact in bf16 too
    }


class Builder:
    """Counts conversions so tests can tell a cache hit from a rebuild."""

    def __init__(self) -> None:
        self.calls = 0
        self.data = _source()

    def __call__(self):
        self.calls += 1
        yield from ((k, v.clone()) for k, v in self.data.items())


def _load(tmp_path, build):
    return cached_tensors(FP, build, len(build.data), cache_dir=tmp_path, progress=False)


def test_round_trip_and_hit(tmp_path) -> None:
    build = Builder()
    first = list(_load(tmp_path, build)())
    assert [k for k, _ in first] == list(build.data)  # order preserved
    for k, v in first:
        assert v.dtype == torch.float32 and torch.equal(v, build.data[k])
    second = dict(_load(tmp_path, build)())
    assert build.calls == 1  # served from the file
    assert all(torch.equal(second[k], v) for k, v in build.data.items())
    assert cache_path(FP, tmp_path).exists()
    assert not [p for p in cache_path(FP, tmp_path).parent.iterdir() if p.name.endswith(".tmp")]


def test_narrowest_exact() -> None:
    assert narrowest_exact(torch.tensor([1.5, -2.0, 0.25])).dtype == torch.bfloat16
    assert narrowest_exact(torch.tensor([1.0 + 2**-9])).dtype == torch.float16  # 10-bit mantissa
    assert narrowest_exact(torch.tensor([1.0 + 2**-20])).dtype == torch.float32
    assert narrowest_exact(torch.tensor([70000.0 + 2**-5])).dtype == torch.float32


def _data_start(path) -> int:
    with path.open("rb") as f:
        return 8 + struct.unpack("<Q", f.read(8))[0]


def _flip_data_byte(path) -> None:
    raw = bytearray(path.read_bytes())
    raw[_data_start(path) + 5] ^= 0xFF
    path.write_bytes(bytes(raw))


def _truncate(path) -> None:
    raw = path.read_bytes()
    path.write_bytes(raw[: len(raw) - 7])


def _garble_header(path) -> None:
    raw = bytearray(path.read_bytes())
    raw[10:20] = b"\x00" * 10
    path.write_bytes(bytes(raw))


def _tiny_file(path) -> None:
    path.write_bytes(b"\x01")


@pytest.mark.parametrize("damage", [_flip_data_byte, _truncate, _garble_header, _tiny_file])
def test_corruption_is_detected_and_rebuilt(tmp_path, damage) -> None:
    build = Builder()
    list(_load(tmp_path, build)())
    path = cache_path(FP, tmp_path)
    good = path.read_bytes()
    damage(path)
    with pytest.warns(UserWarning, match="invalid"):
        stream = _load(tmp_path, build)
    assert build.calls == 2
    got = dict(stream())
    assert all(torch.equal(got[k], v) for k, v in build.data.items())
    assert verify(path, FP) == list(build.data)  # the rebuilt file passes its checks
    assert len(path.read_bytes()) == len(good)


def test_other_converter_version_is_rebuilt(tmp_path, monkeypatch) -> None:
    build = Builder()
    list(_load(tmp_path, build)())
    import augury.weights.convert_cache as cc

    monkeypatch.setattr(cc, "CONVERTER_VERSION", "999")
    with pytest.warns(UserWarning, match="converter version"):
        _load(tmp_path, build)
    assert build.calls == 2


def test_unwritable_cache_falls_back_to_memory(tmp_path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    build = Builder()
    with pytest.warns(UserWarning, match="could not write"):
        stream = cached_tensors(FP, build, 3, cache_dir=blocker, progress=False)
    assert all(torch.equal(v, build.data[k]) for k, v in stream())


def test_env_var_sets_cache_dir(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("AUGURY_CACHE_DIR", str(tmp_path / "envcache"))
    build = Builder()
    list(cached_tensors(FP, build, 3, progress=False)())
    assert (tmp_path / "envcache" / "converted" / f"{FP}.safetensors").exists()


def test_load_checkpoint_gguf_uses_cache(tmp_path, capsys) -> None:
    cfg, model = tiny_hf_model("llama")
    path = write_gguf(tmp_path / "m.gguf", "llama", cfg, model.state_dict())
    ck = load_checkpoint(str(path), cache_dir=tmp_path / "c", progress=True)
    assert "converting weights" in capsys.readouterr().err  # tqdm progress on stderr
    files = list((tmp_path / "c" / "converted").glob("*.safetensors"))
    assert [f.stem for f in files] == [ck.fingerprint]
    meta = json.loads(files[0].read_bytes()[8 : _data_start(files[0])])["__metadata__"]
    assert meta["fingerprint"] == ck.fingerprint
    got = ck.state_dict()
    for k, v in model.state_dict().items():
        assert torch.equal(got[k], v), k
    again = load_checkpoint(str(path), cache_dir=tmp_path / "c", progress=True)
    assert "converting" not in capsys.readouterr().err
    assert again.fingerprint == ck.fingerprint
    os.utime(path)  # touching the file is not a new identity
    assert load_checkpoint(str(path), cache_dir=tmp_path / "c").fingerprint == ck.fingerprint


def test_list_and_clear(tmp_path) -> None:
    from augury.weights.convert_cache import clear, list_entries

    assert list_entries(tmp_path) == [] and clear(tmp_path) == 0
    build = Builder()
    list(_load(tmp_path, build)())
    (cache_path(FP, tmp_path).parent / ".stale.safetensors.1.tmp").write_bytes(b"x" * 10)
    [row] = list_entries(tmp_path)
    assert row["fingerprint"] == FP and row["bytes"] == cache_path(FP, tmp_path).stat().st_size
    assert clear(tmp_path) == row["bytes"] + 10
    assert list_entries(tmp_path) == []
