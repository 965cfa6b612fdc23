"""Paired ratios: each codec run is divided by the native run of its own repetition."""

import pytest

from augury.bench.kv_gpu_paired import paired_ratios


def test_ratio_is_taken_within_each_repetition():
    rates = {"native": [100.0, 200.0, 150.0], "turbo": [90.0, 190.0, 120.0]}
    r = paired_ratios(rates)["turbo"]
    assert r["per_rep"] == pytest.approx([0.9, 0.95, 0.8])
    assert r["median"] == pytest.approx(0.9)
    assert (r["min"], r["max"]) == (pytest.approx(0.8), pytest.approx(0.95))
    assert "native" not in paired_ratios(rates)
