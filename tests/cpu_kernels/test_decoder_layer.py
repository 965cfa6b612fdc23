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


def _run(engine, force, prompts, params, calls, stack=True):
    """Outputs with the path forced on/off (and the one-call stack on/off), counting how often the
    per-layer native call and the stack ran."""
    cpu_decode.FORCE, cpu_decode.STACK = force, stack
    real, real_stack = cpu_decode.layer_rows, cpu_decode.run_stack
    key = (force, stack)

    def counted(*a, **k):
        calls[key] = calls.get(key, 0) + 1
        return real(*a, **k)

    def counted_stack(*a, **k):
        out = real_stack(*a, **k)
        if out is not None:
            calls[key, "stack"] = calls.get((key, "stack"), 0) + 1
        return out

    cpu_decode.layer_rows, cpu_decode.run_stack = counted, counted_stack
    try:
        return [r.token_ids for r in engine.generate_batch(prompts, params)]
    finally:
        cpu_decode.FORCE, cpu_decode.STACK = None, True
        cpu_decode.layer_rows, cpu_decode.run_stack = real, real_stack


def test_decode_and_batches_are_bitwise_the_modules(engine):
    """The modules, the per-layer native call and the one-call stack give the same tokens, and each
    mode runs what it says."""
    ps = _prompts(4)
    params = [SamplingParams(max_tokens=12 + 3 * i, temperature=0.0, ignore_eos=True) for i in range(4)]
    calls: dict = {}
    want = _run(engine, False, ps, params, calls)
    assert _run(engine, True, ps, params, calls, stack=False) == want
    assert _run(engine, True, ps, params, calls) == want
    assert calls.get((True, False), 0) > 0 and calls.get(((True, True), "stack"), 0) > 0
    assert not calls.get((False, True)) and not calls.get(((False, True), "stack"))
    assert not calls.get(((True, False), "stack"))


def test_the_stack_runs_the_first_n_layers_bitwise(engine):
    """cpu_decode.run_stack over the first n layers (what layerskip's draft runs) equals those layers'
    module forwards: the output and every pool it writes."""
    from augury.layers.attention import SeqSpec, build_attention_metadata

    model = engine.loaded.model
    pool = engine.pool
    n = min(2, len(model.layers))
    windows = model.kv_group_windows()
    tables = {g: [1] for g in windows}
    meta = build_attention_metadata([SeqSpec(5, 1, tables)], engine.blocks.block_size, windows, torch.device("cpu"))
    ropes = {name: r(meta.positions) for name, r in model.ropes.items()}
    h = torch.randn(1, model.cfg.hidden_size, generator=torch.Generator().manual_seed(2))
    kv = type("KV", (), {})()
    kv.group_of_layer = list(pool.group_of_layer)
    results = []
    for stack in (False, True):
        kv.k, kv.v = [k.clone() for k in pool.k], [v.clone() for v in pool.v]
        cpu_decode.FORCE = stack  # modules, then the stack
        try:
            with torch.inference_mode():
                out = cpu_decode.run_stack(model, h, ropes, meta, kv, n)
                assert (out is not None) == stack
                if out is None:
                    out = h
                    for i in range(n):
                        layer = model.layers[i]
                        out = layer(out, ropes[layer.self_attn.rope_name], meta.groups[kv.group_of_layer[i]],
                                    kv.k[i], kv.v[i])
        finally:
            cpu_decode.FORCE = None
        results.append((out, kv.k, kv.v))
    (o0, k0, v0), (o1, k1, v1) = results
    assert torch.equal(o0, o1)
    assert all(torch.equal(a, b) for a, b in zip(k0 + v0, k1 + v1))
    cpu_decode.FORCE = True
    try:  # no layers: a copy of h, never h itself (the op's schema declares no alias)
        with torch.inference_mode():
            none = cpu_decode.run_stack(model, h, ropes, meta, kv, 0)
    finally:
        cpu_decode.FORCE = None
    assert torch.equal(none, h) and none.data_ptr() != h.data_ptr()


def test_the_stack_is_rebuilt_when_weights_are_packed_anew(engine):
    model = engine.loaded.model
    cpu_decode.FORCE = True
    try:
        first = cpu_decode._stack(model)
        assert first is not None and cpu_decode._stack(model) is first
        down = model.layers[0].mlp.down_proj
        down._pack_native_scales()  # what a state-dict load or a repack does
        assert cpu_decode._stack(model) is not first
        pre, _ = cpu_decode._constants(model.layers[0])
        assert any(a is down.native_scales for a in pre)  # the per-layer arguments follow, not only qkv's
    finally:
        cpu_decode.FORCE = None


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


def _lines_read(gather, rows, pool):
    """The 64-byte lines (offsets from the pool's start) holding the slots the attention reads."""
    slot_bytes = pool.shape[1] * pool.shape[2] * pool.element_size()
    lines = set()
    for b, lo, hi in rows.tolist():
        for slot in gather[b, lo:hi].tolist():
            if 0 <= slot < pool.shape[0]:
                lines.update(range(slot * slot_bytes // 64, ((slot + 1) * slot_bytes + 63) // 64))
    return lines


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kv_warming_covers_exactly_the_slots_attention_reads(native, dtype) -> None:
    """The stack warms each next layer's K/V during the products before its attention (kernels.h
    WarmRanges): the lines it prefetches are those of the slots the plan reads, each request's once
    (a verify window's rows share their keys), contiguous slots merged into one range, and slots a
    bad plan names outside the pool left out (the attention call reports those)."""
    pool = torch.zeros(64, 3, 24, dtype=dtype)  # 144 or 288 bytes a slot: slots straddle lines
    gather = torch.tensor([[5, 6, 7, 8, 20, 21, 0, 0], [30, 31, 32, 40, 41, 42, 43, 99]])
    rows = torch.tensor([[0, 0, 6], [1, 0, 5], [1, 0, 6], [1, 2, 7], [1, 0, 8]], dtype=torch.int32)
    got = torch.ops.augury_cpu.kv_warm_lines(gather, rows, pool)
    lines = [o // 64 + i for o, n in got.tolist() for i in range(n)]
    assert len(lines) == len(set(lines)) and set(lines) == _lines_read(gather, rows, pool)
    assert got.shape[0] == 4  # runs 5-8, 20-21, 30-32, 40-43 (slot 99 is outside the pool)
    # a plan the attention would reject warms nothing
    assert torch.ops.augury_cpu.kv_warm_lines(gather, rows.long(), pool).shape[0] == 0
