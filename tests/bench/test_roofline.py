"""The roofline's physical limit counts each weight byte once."""

from __future__ import annotations

from types import SimpleNamespace

import torch
from torch import nn

from augury.bench.roofline import weight_bytes
from augury.layers.int4_layout import transpose_scales
from augury.layers.quant_linear import Int4Linear


class _Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(10, 64)
        self.proj = Int4Linear.from_linear(nn.Linear(64, 32, bias=False), 32)
        self.lm_head = nn.Linear(64, 10, bias=False)


def test_derived_scale_copies_are_not_counted_twice():
    m = _Tiny()
    eng = SimpleNamespace(loaded=SimpleNamespace(model=m))
    want = m.proj.packed.nbytes + m.proj.scales_zeros.nbytes + m.lm_head.weight.nbytes  # not the embedding
    assert weight_bytes(eng) == want
    m.proj.gemv_scales = transpose_scales(m.proj.scales_zeros)  # as on CUDA, opted in
    m.proj.gemv_packed = m.proj.packed.clone()  # (the GEMV's own copy of the nibbles)
    m.proj.native_scales = torch.zeros(100)  # the CPU kernel's packed scales
    assert weight_bytes(eng) == want


def test_read_bandwidth_readings_are_positive_rates():
    # both readings (warmed and device-timed; the quick host-timed one kept to compare) divide
    # the bytes read by a best time: a few MB on the CPU is enough to check the arithmetic runs
    from augury.bench.roofline import read_bandwidth, read_bandwidth_quick

    for bw in (read_bandwidth(torch.device("cpu"), gib=0.004, warm_s=0.01),
               read_bandwidth_quick(torch.device("cpu"), gib=0.004)):
        assert 1e8 < bw < 1e13
