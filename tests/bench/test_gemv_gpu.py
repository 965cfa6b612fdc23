"""The GPU microbenchmark's host-side pieces (no GPU needed): its argument checks and the
summary of attention's in-kernel timestamps."""

from __future__ import annotations

import pytest
import torch

from augury.bench import gemv_gpu


def _layer(t0: int, starts: list[int], k: int, v: int, arrive: int, merged: int) -> torch.Tensor:
    """Stamps (ns) of one layer: program p starts at t0 + starts[p]; its K tile is used k ns
    later, its V tile v after that, it arrives `arrive` after that; the last program's merged
    output at t0 + merged."""
    t = torch.zeros(1024, 5, 2, dtype=torch.int64)
    for p, s in enumerate(starts):
        for i, dt in enumerate((0, k, k + v, k + v + arrive)):
            t[p, i, 0] = t0 + s + dt
    t[len(starts) - 1, 4, 0] = t0 + merged
    return t


def test_probe_summary_reads_medians_lasts_and_gaps():
    layers = [_layer(10_000_000 + 20_000 * i, [0, 300, 600], 2_000, 1_000, 500, 5_000) for i in range(3)]
    got = gemv_gpu._probe_summary(layers)
    assert got["programs"] == 3
    assert got["start_median_us"] == pytest.approx(0.3) and got["start_last_us"] == pytest.approx(0.6)
    assert got["k_tile_median_us"] == pytest.approx(2.3) and got["k_tile_last_us"] == pytest.approx(2.6)
    assert got["arrived_last_us"] == pytest.approx(4.1)
    assert got["merged_us"] == pytest.approx(5.0)
    assert got["gap_to_next_layer_us"] == pytest.approx(15.0)  # 20 us apart, each layer's stamps span 5 us


def test_unknown_variants_are_refused(capsys):
    with pytest.raises(SystemExit):
        gemv_gpu.main(["--layer-variants", "attention_no_pdl,nope"])
    assert "nope" in capsys.readouterr().err
    assert set(gemv_gpu.LAYER_VARIANTS) >= {"attention_no_pdl", "pdl", "no_pdl"}
