"""The one-call native CPU layer (augury_cpu::decoder_layer_rows) gives bitwise the modules' own eager forward."""

from __future__ import annotations

import pytest
import torch

from augury.engine.engine import Engine
from augury.engine.types import SamplingParams
from augury.layers import cpu_decode


@pytest.fixture(scope="module", params=["llama", "qwen3", "gemma3_text"])
def engine(request, tmp_path_factory, native):
    """Int4 engines of the three layer shapes the native call covers: pre-norm with SiLU, with a q/k
    norm, and Gemma 3's sandwich norms ((1 + w) scaling, GELU-tanh, sliding-window layers)."""
    from tests.conftest import make_tiny_hf_model

    path = make_tiny_hf_model(tmp_path_factory.mktemp(f"layer_{request.param}"), request.param)
    e = Engine.from_model(str(path), device="cpu", dtype="float32", weights="int4", progress=False,
                          kv_budget="4MiB", enable_prefix_caching=False)
    yield e
    e.shutdown()


def _prompts(n):
    g = torch.Generator().manual_seed(5)
    return [torch.randint(3, 250, (4 + 7 * i,), generator=g).tolist() for i in range(n)]


def _run(engine, force, prompts, params, calls):
    """Outputs with the path forced on/off, counting how often the native layer ran."""
    cpu_decode.FORCE = force
    real = cpu_decode.layer_rows

    def counted(*a, **k):
        calls[force] = calls.get(force, 0) + 1
        return real(*a, **k)

    cpu_decode.layer_rows = counted
    try:
        return [r.token_ids for r in engine.generate_batch(prompts, params)]
    finally:
        cpu_decode.FORCE = None
        cpu_decode.layer_rows = real


def test_decode_and_batches_are_bitwise_the_modules(engine):
    ps = _prompts(4)
    params = [SamplingParams(max_tokens=12 + 3 * i, temperature=0.0, ignore_eos=True) for i in range(4)]
    calls: dict = {}
    want = _run(engine, False, ps, params, calls)
    got = _run(engine, True, ps, params, calls)
    assert got == want
    assert calls.get(True, 0) > 0 and calls.get(False, 0) == 0


@pytest.mark.parametrize("pool_dtype", [torch.float32, torch.bfloat16])
def test_layer_output_is_bitwise_the_modules_forward(engine, pool_dtype):
    """One layer, a 3-row step over a real pool: the native call equals the module forward exactly
    (bf16 pools too: the K/V rows are rounded to nearest even, as the module's `.to()` does)."""
    from augury.layers.attention import SeqSpec, build_attention_metadata

    model = engine.loaded.model
    layer = model.layers[0]
    pool = engine.pool
    bs = engine.blocks.block_size
    kv = pool.k[0].to(pool_dtype), pool.v[0].to(pool_dtype)
    meta = build_attention_metadata([SeqSpec(5, 3, {"full": [1]}), SeqSpec(0, 1, {"full": [2]})], bs,
                                    {"full": None}, torch.device("cpu"))
    gm = meta.groups["full"]
    ropes = {name: r(meta.positions) for name, r in model.ropes.items()}
    rope = ropes[layer.self_attn.rope_name]
    h = torch.randn(4, model.cfg.hidden_size, generator=torch.Generator().manual_seed(1))
    outs, pools = [], []
    for force in (False, True):
        k, v = kv[0].clone(), kv[1].clone()
        cpu_decode.FORCE = force
        try:
            assert cpu_decode.eligible(layer, h, gm, k) == force
            with torch.inference_mode():
                outs.append(layer(h, rope, gm, k, v))
        finally:
            cpu_decode.FORCE = None
        pools.append((k, v))
    assert torch.equal(outs[0], outs[1])
    assert torch.equal(pools[0][0], pools[1][0]) and torch.equal(pools[0][1], pools[1][1])


def test_layers_it_does_not_cover_are_not_eligible(engine):
    layer = engine.loaded.model.layers[0]
    gm = type("G", (), {"max_q": 1})()
    h = torch.zeros(1, engine.loaded.model.cfg.hidden_size)
    cpu_decode.FORCE = True
    try:
        assert cpu_decode.eligible(layer, h, gm, engine.pool.k[0])
        gm.max_q = 64  # a prefill chunk: the modules' path
        assert not cpu_decode.eligible(layer, h, gm, engine.pool.k[0])
    finally:
        cpu_decode.FORCE = None
