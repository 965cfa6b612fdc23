"""The GPU microbenchmark's host-side pieces (no GPU needed): its argument checks and the
summary of attention's in-kernel timestamps."""

from __future__ import annotations

import pytest
import torch

from augury.bench import gemv_gpu


def _layer(t0: int, starts: list[int], phases_cycles: list[int], merged_at: int) -> torch.Tensor:
    """Stamps of one layer: programs starting at t0 + starts[p] ns; each phase takes the given
    cycles; the last program's merge stamp at t0 + merged_at ns."""
    t = torch.zeros(1024, 5, 2, dtype=torch.int64)
    for p, s in enumerate(starts):
        c = 1_000_000
        t[p, 0] = torch.tensor([t0 + s, c])
        for i, dc in enumerate(phases_cycles[:3], start=1):
            c += dc
            t[p, i] = torch.tensor([t0 + s + (c - 1_000_000) // 2, c])
    last = len(starts) - 1
    t[last, 4] = torch.tensor([t0 + merged_at, int(t[last, 3, 1]) + phases_cycles[3]])
    return t


def test_probe_summary_reads_spans_phases_and_gaps():
    ghz = gemv_gpu._SM_GHZ
    cyc = [int(2000 * ghz), int(1000 * ghz), int(500 * ghz), int(700 * ghz)]  # 2, 1, 0.5, 0.7 us
    layers = [_layer(10_000_000 + 20_000 * i, [0, 300, 600], cyc, 5_000) for i in range(3)]
    got = gemv_gpu._probe_summary(layers)
    assert got["programs"] == 3
    assert got["start_spread_us"] == pytest.approx(0.6)
    assert got["merged_us"] == pytest.approx(5.0)
    assert got["k_phase_us"] == pytest.approx(2.0, abs=1e-3)
    assert got["v_phase_us"] == pytest.approx(1.0, abs=1e-3)
    assert got["arrive_us"] == pytest.approx(0.5, abs=1e-3)
    assert got["merge_us"] == pytest.approx(0.7, abs=1e-3)
    assert got["gap_to_next_layer_us"] == pytest.approx(15.0)  # 20 us apart, each layer's stamps span 5 us


def test_unknown_variants_are_refused(capsys):
    with pytest.raises(SystemExit):
        gemv_gpu.main(["--layer-variants", "attention_no_pdl,nope"])
    assert "nope" in capsys.readouterr().err
    assert set(gemv_gpu.LAYER_VARIANTS) >= {"attention_no_pdl", "pdl", "no_pdl"}
