"""The same-bytes llama.cpp peer: which GGUFs need a copy, the copy itself (layers byte-identical,
head at the layers' type), and the decode target it adds."""

import importlib.util

import pytest
from fakes import FakePeer, FakeTokenizer

from augury.bench import scenarios
from augury.bench.options import BenchOptions
from augury.bench.peers import same_bits
from augury.bench.scenarios import Setup
from tests.conftest import needs_smollm2, smollm2_path


@needs_smollm2
def test_smollm2_keeps_its_head_at_8_bits():
    """The reason for the peer: Q4_1 layers, a Q8_0 token embedding (the tied LM head)."""
    from pathlib import Path

    assert same_bits.tensor_types(Path(smollm2_path())) == ("Q4_1", "Q8_0")
    assert same_bits.needs_copy(Path(smollm2_path()))


@needs_smollm2
@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None, reason="needs llama-cpp-python")
def test_the_copy_changes_only_the_head(tmp_path):
    from pathlib import Path

    import numpy as np
    from gguf import GGUFReader

    src = Path(smollm2_path())
    dst = same_bits.same_bits_gguf(src, tmp_path)
    assert same_bits.tensor_types(dst) == ("Q4_1", "Q4_1") and not same_bits.needs_copy(dst)
    a, b = GGUFReader(str(src)), {t.name: t for t in GGUFReader(str(dst)).tensors}
    for t in a.tensors:
        if t.name.startswith("blk."):
            assert b[t.name].tensor_type == t.tensor_type
            assert np.array_equal(np.asarray(t.data).view(np.uint8), np.asarray(b[t.name].data).view(np.uint8))
    stamp = dst.stat().st_mtime_ns
    assert same_bits.same_bits_gguf(src, tmp_path) == dst and dst.stat().st_mtime_ns == stamp  # made once


def test_decode_reports_both_llama_cpp_targets():
    peers = {"llama.cpp": FakePeer("llama.cpp", 100.0), "llama.cpp-q4head": FakePeer("llama.cpp-q4head", 120.0)}
    s = Setup(BenchOptions(reps=2, warmup=0), FakePeer("augury", 150.0), FakeTokenizer(), peers, None, {})
    rep = scenarios.decode(s)
    got = {t.name: t.value for t in rep.targets}
    assert got["decode B=1 vs llama.cpp"] == pytest.approx(1.5)
    assert got["decode B=1 vs llama.cpp, its head at augury's bits"] == pytest.approx(1.25)
