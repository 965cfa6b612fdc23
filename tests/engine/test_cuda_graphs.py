"""CUDA graphs replay decode steps with exactly the eager path's tokens (GPU only)."""

import pytest
import torch

from augury.engine.engine import Engine
from augury.engine.types import SamplingParams
from tests.conftest import needs_cuda

pytestmark = needs_cuda


@pytest.mark.parametrize("burst", [0, 8])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_graph_replay_equals_eager(tiny_llama_dir, dtype, burst):
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 300, (5 + 7 * i,), generator=g).tolist() for i in range(6)]
    sp = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    outs = {}
    for graphs in (False, True):
        e = Engine.from_model(str(tiny_llama_dir), device="cuda", dtype=dtype, progress=False, kv_budget="16MiB",
                              cuda_graphs=graphs, decode_burst=burst if graphs else 0)
        try:
            outs[graphs] = ([e.generate(p, sp).token_ids for p in prompts],
                            [r.token_ids for r in e.generate_batch(prompts, sp)])
            if graphs:
                assert e.runner.graphs.bursts if burst else e.runner.graphs.graphs, "no graph was captured"
        finally:
            e.shutdown()
    assert outs[True] == outs[False]


@pytest.mark.parametrize("burst", [0, 4])
def test_gemma3_sliding_groups_under_graphs(tmp_path, burst):
    from tests.conftest import make_tiny_hf_model

    d = make_tiny_hf_model(tmp_path / "g", "gemma3_text", sliding_window=8)
    sp = SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True)
    p = list(range(10, 30))
    got = []
    for graphs in (False, True):
        e = Engine.from_model(str(d), device="cuda", dtype="float32", progress=False, kv_budget="16MiB",
                              cuda_graphs=graphs, decode_burst=burst if graphs else 0)
        try:
            got.append(e.generate(p, sp).token_ids)
        finally:
            e.shutdown()
    assert got[0] == got[1]
