"""augury.bench.kv_gpu without a GPU: the capacity table (pure arithmetic) and the JSON it writes."""

from __future__ import annotations

import json

import pytest
import torch

from augury.bench import kv_gpu


@pytest.mark.skipif(torch.cuda.is_available(), reason="with CUDA the script runs the full GPU benchmark")
def test_capacity_only_without_cuda(tmp_path, capsys):
    assert kv_gpu.main(["--out", str(tmp_path), "--schemes", "turbo,turbo:rk4v3"]) == 0
    res = json.loads((tmp_path / "kv_gpu.json").read_text())
    cap = {r["codec"]: r for r in res["capacity"]}
    assert cap["native"]["vs_native"] == 1.0 and cap["native"]["bits_per_element"] == 16.0
    # same budget, blocks sized by encoded bytes: ratio = 16 / bits per element
    assert cap["turbo"]["vs_native"] == pytest.approx(16 / 6.25, rel=0.01)
    assert cap["turbo:rk4v3"]["vs_native"] >= 3.5  # the capacity target
    assert cap["turbo:rk4v3"]["fit_max_context"] > cap["native"]["fit_max_context"] * 3.5
    assert "engine" not in res and "turbo:rk4v3" in capsys.readouterr().out
