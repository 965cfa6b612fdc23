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


@pytest.mark.parametrize("graphs", [True, False])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_chained_bursts_equal_bursts_off(tiny_llama_dir, dtype, graphs):
    """Pipelined bursts (the next burst launched from the last argmax row on the device before the
    one in flight is read back) give bitwise the tokens of bursts off and of unchained bursts: a
    batch whose requests end at different lengths, a lone request stopped by a stop id while the
    next burst is in flight, and one whose KV crosses a KV_BUCKET (the chain changes graphs)."""
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, 300, (5 + 7 * i,), generator=g).tolist() for i in range(6)]
    params = [SamplingParams(max_tokens=11 + 9 * i, temperature=0.0, ignore_eos=True) for i in range(6)]
    long_p = torch.randint(3, 300, (230,), generator=g).tolist()
    sp = SamplingParams(max_tokens=50, temperature=0.0, ignore_eos=True)
    outs, stop = {}, None
    for name, burst, pipeline in (("off", 0, True), ("single", 8, False), ("chained", 8, True)):
        e = Engine.from_model(str(tiny_llama_dir), device="cuda", dtype=dtype, progress=False, kv_budget="16MiB",
                              cuda_graphs=graphs, decode_burst=burst, burst_pipeline=pipeline)
        try:
            full = e.generate(prompts[2], sp).token_ids
            if stop is None:  # a token first seen past the first bursts ends the request there
                stop = next(j for j in range(12, len(full)) if full[j] not in full[:j])
                assert stop < 40
            stopped = e.generate(prompts[2], SamplingParams(max_tokens=50, temperature=0.0, ignore_eos=True,
                                                            stop_token_ids=[full[stop]]))
            assert stopped.finish_reason == "stop" and len(stopped.token_ids) == stop + 1
            outs[name] = ([r.token_ids for r in e.generate_batch(prompts, params)], full, stopped.token_ids,
                          e.generate(long_p, sp).token_ids)
            st = e.stats()
            assert (st["burst_chained"] > 0) == (name == "chained")
            if burst and graphs:
                assert e.runner.graphs.bursts, "no burst graph was captured"
            assert e.wait_idle()
            e.blocks.reset_prefix_cache()
            assert e.stats()["kv_blocks_free"] == e.stats()["kv_blocks_total"]
        finally:
            e.shutdown()
    assert outs["chained"] == outs["off"]
    assert outs["single"] == outs["off"]
