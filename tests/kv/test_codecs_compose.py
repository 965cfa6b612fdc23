"""Encoded KV composing with speculation and the SSD tier: rollback trims encoded
blocks (greedy equals plain, nothing leaks) and encoded blocks survive a restart."""

from __future__ import annotations

import pytest
import torch

from augury.engine.engine import Engine
from augury.engine.types import SamplingParams
from tests.conftest import make_tiny_hf_model


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    # head_dim 64: the Hadamard transform and 32-wide groups need it
    hd64 = dict(hidden_size=128, num_attention_heads=2, num_key_value_heads=1)
    target = make_tiny_hf_model(tmp_path_factory.mktemp("t64"), "llama", seed=0, **hd64)
    draft = make_tiny_hf_model(tmp_path_factory.mktemp("d64"), "llama", seed=1, num_hidden_layers=1, **hd64)
    return target, draft


def _engine(path, **kw) -> Engine:
    kw.setdefault("kv_budget", "4MiB")
    return Engine.from_model(str(path), device="cpu", dtype="float32", progress=False, **kw)


def _repetitive(n: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(3)
    out = []
    for i in range(n):
        base = torch.randint(3, 300, (6 + i,), generator=g).tolist()
        out.append(base * 3 + base[:2])  # repeats give ngram drafts to verify (and reject)
    return out


def _params(method, k=4, max_tokens=24):
    spec = False if method is None else {"method": method, "num_draft_tokens": k}
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, speculative=spec)


@pytest.fixture(scope="module")
def spec_turbo(dirs):
    target, draft = dirs
    e = _engine(target, kv_quant="turbo", draft_model=str(draft), spec_adaptive=False)
    yield e
    e.shutdown()


@pytest.mark.parametrize("method", ["ngram", "draft-model"])
def test_spec_rollback_on_encoded_blocks_is_exact(spec_turbo, method):
    e = spec_turbo
    assert not e.kv_codec.is_native
    ps = _repetitive(3)
    plain = [e.generate(p, _params(None)).token_ids for p in ps]
    alone = [e.generate(p, _params(method)) for p in ps]
    assert [r.token_ids for r in alone] == plain
    s = [r.speculation for r in alone]
    assert sum(x["drafted"] for x in s) > 0
    # the random model rejects most drafts: rollback (trim of encoded blocks) really happened
    assert sum(x["drafted"] - x["accepted"] for x in s) > 0
    assert [r.token_ids for r in e.generate_batch(ps, _params(method))] == plain


def test_spec_on_encoded_blocks_leaks_nothing(spec_turbo):
    e = spec_turbo
    e.wait_idle()
    free0 = e.stats()["kv_blocks_free"]
    dm = e.drafters["draft-model"]
    d0 = dm.blocks.num_free_blocks()
    hs = [e.submit(p, _params(m, max_tokens=200)) for p, m in zip(_repetitive(4), ["ngram", "draft-model"] * 2)]
    next(iter(hs[0]))
    hs[1].cancel()
    for h in hs:
        Engine.collect(h)
    e.wait_idle()
    assert e.stats()["kv_blocks_free"] == free0
    assert dm.blocks.num_free_blocks() == d0
    e.blocks.reset_prefix_cache()
    assert e.blocks.num_free_blocks() == e.blocks.num_total_blocks()


@pytest.mark.parametrize("scheme", ["turbo", "affine4"])
def test_ssd_round_trip_of_encoded_blocks(dirs, tmp_path, scheme):
    target, _ = dirs
    g = torch.Generator().manual_seed(4)
    p = torch.randint(3, 300, (90,), generator=g).tolist()
    greedy = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    kw = dict(kv_quant=scheme) if scheme.startswith("turbo") else dict(kv_bits=4, kv_group_size=32)
    with _engine(target, enable_prefix_caching=False, **kw) as cold:
        miss = cold.generate(p + [7], greedy).token_ids
    with _engine(target, ssd_cache_dir=str(tmp_path), **kw) as e:
        ns = e.namespace
        # the codec and its parameters are the blocks' storage class: in every block hash (file name)
        assert e.blocks.class_names() == [e.kv_codec.id]
        assert e.generate(p, greedy).token_ids
        st = e.flush_cache()
        assert st["flushed"] and st["prefix_cache_ssd_files"] >= 5
    with _engine(target, ssd_cache_dir=str(tmp_path), **kw) as e2:  # a fresh process's view
        assert e2.namespace == ns
        r = e2.generate(p + [7], greedy)
        assert r.cached_tokens == 80 and e2.blocks.restored_blocks == 5
        assert r.token_ids == miss
    # another codec never reads these files
    with _engine(target, ssd_cache_dir=str(tmp_path), kv_quant="turbo:k8v4") as e3:
        assert e3.blocks.class_names() != [e.kv_codec.id]  # another storage class: other block hashes
        r = e3.generate(p + [7], greedy)
        assert r.cached_tokens == 0 and e3.blocks.restored_blocks == 0
