"""Speculative decoding through the engine: every method emits exactly what plain
decoding emits (greedy), keeps the sampling distribution, and leaks nothing."""

from __future__ import annotations

import pytest
import torch

from augury.engine.engine import Engine
from augury.engine.types import SamplingParams
from augury.spec.draft_model import TokenizerMismatch
from tests.conftest import device_under_test, make_tiny_hf_model

METHODS = ["ngram", "draft-model", "layerskip"]


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    target = make_tiny_hf_model(tmp_path_factory.mktemp("target"), "llama", seed=0)
    draft = make_tiny_hf_model(tmp_path_factory.mktemp("draft"), "llama", seed=1, num_hidden_layers=1)
    return target, draft


def make(target, draft, **kw):
    kw.setdefault("kv_budget", "8MiB")
    # fixed draft lengths: a cost curve measured on a tiny model may (rightly) say drafting does
    # not pay, and these tests are about what drafting emits
    kw.setdefault("spec_adaptive", False)
    return Engine.from_model(str(target), device=str(device_under_test()), dtype="float32", progress=False,
                             draft_model=str(draft), spec_layers=1, **kw)


@pytest.fixture(scope="module")
def engine(dirs):
    e = make(*dirs)
    yield e
    e.shutdown()


def repetitive_prompts(n: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(3)
    out = []
    for i in range(n):
        base = torch.randint(3, 300, (6 + i,), generator=g).tolist()
        out.append(base * 3 + base[:2])  # repeats give ngram something to find
    return out


def params(method, k=4, **kw):
    kw.setdefault("max_tokens", 24)
    kw.setdefault("temperature", 0.0)
    kw.setdefault("ignore_eos", True)
    spec = False if method is None else {"method": method, "num_draft_tokens": k}
    return SamplingParams(speculative=spec, **kw)


@pytest.mark.parametrize("method", METHODS)
def test_greedy_identical_b1_and_b4(engine, method):
    ps = repetitive_prompts(4)
    plain = [engine.generate(p, params(None)).token_ids for p in ps]
    alone = [engine.generate(p, params(method)) for p in ps]
    assert [r.token_ids for r in alone] == plain
    batch = engine.generate_batch(ps, params(method))
    assert [r.token_ids for r in batch] == plain
    assert sum(r.speculation["drafted"] for r in alone) > 0
    assert all(r.speculation["method"] == method for r in alone)


def test_methods_mixed_in_one_batch_and_prefix_hit(engine):
    ps = repetitive_prompts(4)
    plain = [engine.generate(p, params(None)).token_ids for p in ps]
    mixed = engine.generate_batch(ps, [params(None), params("ngram"), params("draft-model"), params("layerskip")])
    assert [r.token_ids for r in mixed] == plain
    again = engine.generate(ps[3], params("ngram"))  # prefix hit on a prompt seen above
    assert again.cached_tokens > 0 and again.token_ids == plain[3]


def test_chunked_prefill_with_spec(dirs):
    e = make(*dirs, max_num_batched_tokens=16, enable_prefix_caching=False)
    try:
        ps = repetitive_prompts(3)
        plain = [e.generate(p, params(None)).token_ids for p in ps]
        for m in METHODS:
            assert [r.token_ids for r in e.generate_batch(ps, params(m))] == plain
    finally:
        e.shutdown()


def test_same_model_as_draft_accepts_everything(dirs):
    target, _ = dirs
    e = Engine.from_model(str(target), device=str(device_under_test()), dtype="float32", progress=False,
                          kv_budget="8MiB", draft_model=str(target), spec_adaptive=False)
    try:
        r = e.generate(repetitive_prompts(1)[0], params("draft-model", k=4))
        s = r.speculation
        assert s["accepted"] == s["drafted"] and s["mean_accepted_length"] > 4
        assert r.token_ids == e.generate(repetitive_prompts(1)[0], params(None)).token_ids
    finally:
        e.shutdown()


def test_no_blocks_leak_in_any_pool_with_cancellation(engine):
    engine.wait_idle()
    free0 = engine.stats()["kv_blocks_free"]
    dm, ls = engine.drafters["draft-model"], engine.drafters["layerskip"]
    d0, l0 = dm.blocks.num_free_blocks(), ls.blocks.num_free_blocks()
    hs = [engine.submit(p, params(m, max_tokens=300)) for p, m in zip(repetitive_prompts(6), METHODS * 2)]
    next(iter(hs[0]))
    for h in hs[::2]:
        h.cancel()
    for h in hs:
        Engine.collect(h)
    engine.wait_idle()
    assert engine.stats()["kv_blocks_free"] == free0
    assert dm.blocks.num_free_blocks() == d0 and ls.blocks.num_free_blocks() == l0


def test_stop_string_inside_accepted_burst(dirs):
    target, _ = dirs
    e = Engine.from_model(str(target), device=str(device_under_test()), dtype="float32", progress=False,
                          kv_budget="8MiB", draft_model=str(target), spec_adaptive=False)
    try:
        p = repetitive_prompts(1)[0]
        full = e.generate(p, params(None, max_tokens=30))
        needle = full.text[len(full.text) // 2: len(full.text) // 2 + 3]
        if len(needle) < 3:
            pytest.skip("text too short")
        cut = full.text[: full.text.index(needle)]
        r = e.generate(p, params("draft-model", k=8, max_tokens=30, stop=[needle]))
        assert r.finish_reason == "stop" and r.text == cut
        eos_like = full.token_ids[5]
        r2 = e.generate(p, params("draft-model", k=8, max_tokens=30, stop_token_ids=[eos_like]))
        assert r2.token_ids == full.token_ids[: full.token_ids.index(eos_like) + 1]
    finally:
        e.shutdown()


def test_tokenizer_probe_refuses_mismatched_pair(dirs, tmp_path):
    import json

    target, draft = dirs
    other = make_tiny_hf_model(tmp_path / "other", "llama", seed=2)
    tj = json.loads((other / "tokenizer.json").read_text())
    vocab = tj["model"]["vocab"]
    # swap two ids: same vocabulary size, different meaning
    a, b = list(vocab)[100], list(vocab)[101]
    vocab[a], vocab[b] = vocab[b], vocab[a]
    (other / "tokenizer.json").write_text(json.dumps(tj))
    with pytest.raises(TokenizerMismatch, match="tokenizer"):
        Engine.from_model(str(target), device="cpu", dtype="float32", progress=False, kv_budget="8MiB",
                          draft_model=str(other))


def test_unavailable_method_is_a_clear_error(tiny_llama_dir):
    e = Engine.from_model(str(tiny_llama_dir), device="cpu", dtype="float32", progress=False, kv_budget="4MiB")
    try:
        with pytest.raises(ValueError, match="draft-model"):
            e.submit([1, 2, 3], params("draft-model"))
    finally:
        e.shutdown()
