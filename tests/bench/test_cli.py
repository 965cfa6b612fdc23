"""`augury bench SCENARIO --json` through the real CLI, with fake engines behind build_setup."""

import json

import pytest
from fakes import FakePeer, FakeTokenizer

import augury.bench.load as load
from augury.bench.scenarios import Setup
from augury.cli import main


def test_bench_json_prints_one_object_with_ratios(monkeypatch, tmp_path, capsys):
    made = {}

    def fake_setup(opts, scenario):
        made["opts"], made["scenario"] = opts, scenario
        return Setup(opts, FakePeer("augury", 200.0), FakeTokenizer(), {"llama.cpp": FakePeer("llama.cpp", 160.0)},
                     None, {"hf": "skipped in test"})

    monkeypatch.setattr(load, "build_setup", fake_setup)
    rc = main(["bench", "decode", "--json", "--reps", "2", "--threads", "3", "--weights", "int8",
               "--out", str(tmp_path), "--no-plot", "--decode-tokens", "16"])
    assert rc == 0
    d = json.loads(capsys.readouterr().out)
    assert d["ratios"] == {"llama.cpp": pytest.approx(1.25)}
    assert d["machine"]["threads"] == 3 and "revision" in d["machine"]
    assert made["scenario"] == "decode" and made["opts"].weights == "int8" and made["opts"].reps == 2
    assert (tmp_path / "decode.json").exists()


def test_bench_rejects_unknown_peer(capsys):
    assert main(["bench", "decode", "--peers", "vllm"]) == 2
    assert "--peers" in capsys.readouterr().err
