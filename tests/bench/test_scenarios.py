"""Whole scenarios on fake engines: the JSON shape, the ratios and the targets."""

import json

import pytest
import torch
from fakes import FakePeer, FakeTokenizer

from augury.bench import scenarios
from augury.bench.model_facts import ModelFacts
from augury.bench.options import BenchOptions
from augury.bench.report import render_table, write_outputs
from augury.bench.runner import Sample
from augury.bench.scenarios import Limit, Setup


def _setup(**opt_kw):
    opts = BenchOptions(reps=3, warmup=1, **opt_kw)
    peers = {"llama.cpp": FakePeer("llama.cpp", 100.0, prefill=500.0), "hf": FakePeer("hf", 25.0, batch_factor=0.5)}
    return Setup(opts, FakePeer("augury", 150.0, prefill=600.0, batch_factor=1.0, accepted=3.0), FakeTokenizer(),
                 peers, None, {"other": "not installed"})


def test_decode_report_json_shape_and_ratios():
    rep = scenarios.decode(_setup())
    d = json.loads(rep.to_json())
    assert d["scenario"] == "decode" and d["headline"] == "B=1"
    assert set(d["ratios"]) == {"llama.cpp", "hf"}
    assert d["ratios"]["llama.cpp"] == pytest.approx(1.5)
    assert d["ratios"]["hf"] == pytest.approx(6.0)
    case = d["cases"][0]
    assert case["results"]["augury"]["n"] == 3
    assert set(case["results"]["augury"]) == {"median", "min", "max", "n", "samples"}
    assert d["targets"][0]["value"] == pytest.approx(1.5) and d["targets"][0]["met"] is True
    assert d["skipped"] == {"other": "not installed"}
    assert d["config"]["weights"] == "int4"


def test_prefill_headline_is_first_length():
    rep = scenarios.prefill(_setup(prefill_lens=(64, 128)))
    assert [c.name for c in rep.cases] == ["prompt 64", "prompt 128"]
    assert rep.headline == "prompt 64"
    assert rep.ratios["llama.cpp"] == pytest.approx(600.0 / 500.0)
    assert rep.targets[0].met is True


def test_batch_serial_peer_and_scaling_target():
    rep = scenarios.batch(_setup(batch_sizes=(1, 8), hf_max_batch=4, batch_tokens=16))
    b8 = rep.case("B=8")
    assert "hf" not in b8.results  # above hf_max_batch
    # llama.cpp has no batch API: its aggregate is its own single-stream rate (end to end)
    assert b8.results["llama.cpp"].median == pytest.approx(16 / (32 / 500.0 + 15 / 100.0))
    assert b8.results["augury"].median == pytest.approx(8 * 150.0)
    scale = next(t for t in rep.targets if "B=8" in t.name)
    assert scale.value == pytest.approx(8.0) and scale.met


def test_spec_cases_subject_and_accepted_length():
    s = _setup(spec_sets=("grounded",), spec_methods=("ngram",), spec_max_tokens=8)
    s.peers["llama.cpp-pld10"] = FakePeer("llama.cpp-pld10", 120.0)
    rep = scenarios.spec(s)
    c = rep.case("grounded")
    assert c.subject == "augury-ngram"
    assert c.ratios["augury"] == pytest.approx(2.0)  # fake ngram doubles the plain rate
    assert c.extras["augury-ngram"]["accepted_len"] == pytest.approx(3.0)
    names = {t.name: t for t in rep.targets}
    assert names["ngram vs augury plain, grounded set"].value == pytest.approx(2.0)
    assert names["ngram vs llama.cpp-pld10, grounded set"].value == pytest.approx(300.0 / 120.0)


def test_limit_series_uses_measured_bandwidth(monkeypatch):
    facts = ModelFacts("x.gguf", weight_bytes=100_000_000, block_params=10_000_000, num_layers=2, num_heads=2,
                       head_dim=8)
    monkeypatch.setattr(scenarios, "measure_bandwidth", lambda dev: 40e9)
    s = _setup()
    s.limit = Limit(facts, torch.device("cpu"))
    rep = scenarios.decode(s)
    assert rep.case("B=1").results["limit"].median == pytest.approx(400.0)
    assert rep.ratios["limit"] == pytest.approx(150.0 / 400.0)


def test_outputs_written(tmp_path):
    rep = scenarios.decode(_setup())
    paths = write_outputs(rep, tmp_path, plot=True)
    assert json.loads(paths["json"].read_text())["scenario"] == "decode"
    assert "| B=1 | augury |" in paths["md"].read_text()
    pytest.importorskip("matplotlib")
    assert paths["png"].read_bytes()[:4] == b"\x89PNG"


def test_table_marks_subject_and_ratio():
    t = render_table(scenarios.decode(_setup()))
    assert "(subject)" in t and "1.50×" in t and "skipped other" in t


def test_runner_alternates_and_warms_up():
    from augury.bench.runner import run_case

    calls = []

    def mk(n):
        return lambda: (calls.append(n), Sample(1.0))[1]

    run_case("c", "tok/s", "a", {"a": mk("a"), "b": mk("b")}, reps=2, warmup=1)
    assert calls == ["a", "b", "a", "b", "b", "a"]


def test_runner_interleaves_cases_within_each_repetition():
    """Each repetition measures every case once (rotated), so a slow spell of the machine lands on
    every case alike; sample i of each series comes from repetition i."""
    from augury.bench.runner import CaseSpec, run_cases

    calls = []

    def mk(tag):
        return lambda: (calls.append(tag), Sample(float(len(calls))))[1]

    c1, c2 = run_cases([CaseSpec("c1", "tok/s", "a", {"a": mk("1a"), "b": mk("1b")}),
                        CaseSpec("c2", "tok/s", "a", {"a": mk("2a")})], reps=2, warmup=1)
    assert calls == ["1a", "1b", "2a",  # warm-up
                     "1a", "1b", "2a",  # rep 1
                     "2a", "1b", "1a"]  # rep 2: cases and engines rotated
    assert c1.results["a"].samples == (4.0, 9.0) and c2.results["a"].samples == (6.0, 7.0)


def test_paired_ratios_per_repetition():
    from augury.bench.stats import paired_ratios

    assert paired_ratios([8.0, 9.0, 5.0], [2.0, 3.0, 0.0]) == [4.0, 3.0]


def test_batch_reports_the_per_repetition_ratio():
    rep = scenarios.batch(_setup(batch_sizes=(1, 8), hf_max_batch=4, batch_tokens=16))
    assert any("B=8 / B=1 per repetition" in n and "8.00x" in n for n in rep.notes)


def test_batch_reports_the_decode_phase_alone():
    """Tokens after each sequence's first over the time after the last first token (S_TG): B=8 of the
    fake is (128 - 8) / (0.8 * 128 / 1200) and B=1 (16 - 1) / (0.8 * 16 / 150)."""
    rep = scenarios.batch(_setup(batch_sizes=(1, 8), hf_max_batch=4, batch_tokens=16))
    assert rep.case("B=8").extras["augury"]["decode phase"] == pytest.approx(120 / (0.8 * 128 / 1200))
    assert rep.case("B=1").extras["augury"]["decode phase"] == pytest.approx(15 / (0.8 * 16 / 150))
    assert any("decode phase alone" in n and "B=8 1406, B=1 176 tok/s, 8.00x" in n for n in rep.notes)
    assert "llama.cpp" not in rep.case("B=8").extras  # a serial peer reports no decode phase


def test_batch_timing_decode_rate():
    from augury.bench.peers.base import BatchTiming

    assert BatchTiming(40, 2.0, 4, 0.5).decode_rate == pytest.approx(36 / 1.5)
    assert BatchTiming(40, 2.0).decode_rate is None  # an engine that reports no first-token times
    assert BatchTiming(4, 2.0, 4, 0.5).decode_rate is None  # nothing after the first tokens
