"""Several KV codecs in one pool: mixed-codec batches, delayed conversion (start = N),
reuse only at the stored precision, speculative rollback, SSD round trip."""

from __future__ import annotations

import pytest
import torch

from augury.engine.engine import Engine
from augury.engine.types import SamplingParams
from augury.kv.block_manager import BlockClasses, BlockManager, KVGroup, chain_hashes

BS = 16


def _engine(path, **kw) -> Engine:
    kw.setdefault("kv_budget", "4MiB")
    return Engine.from_model(str(path), device="cpu", dtype="float32", progress=False, block_size=BS, **kw)


def _greedy(kv=None, n=12, **kw) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True, kv_cache=kv, **kw)


def _prompts(n, seed=3, length=40):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 300, (length + 7 * i,), generator=g).tolist() for i in range(n)]


@pytest.fixture(scope="module")
def mixed(hd64_dir):
    e = _engine(hd64_dir, kv_quant="turbo", kv_extra_codecs="native,affine4")
    yield e
    e.shutdown()


KVS = [None, {"codec": "native"}, {"codec": "affine", "key_bits": 4}, {"codec": "turbo", "start": 32}]


def test_pool_has_one_class_per_codec(mixed):
    names = mixed.blocks.class_names()
    assert names[0] == mixed.kv_codec.id and "" in names and len(names) == 3
    assert mixed.stats()["kv_classes"][1:] == ["native", next(n for n in names[1:] if n)]


def test_mixed_codec_batch_equals_each_alone(mixed, hd64_dir):
    ps = _prompts(len(KVS))
    alone = [mixed.generate(p, _greedy(kv)).token_ids for p, kv in zip(ps, KVS)]
    together = [r.token_ids for r in mixed.generate_batch(ps, [_greedy(kv) for kv in KVS])]
    assert together == alone
    # and a pool that stores only that codec gives the same tokens
    with _engine(hd64_dir) as native:
        assert native.generate(ps[1], _greedy()).token_ids == alone[1]
    with _engine(hd64_dir, kv_bits=4) as aff:
        assert aff.generate(ps[2], _greedy()).token_ids == alone[2]
    with _engine(hd64_dir, kv_quant="turbo") as turbo:
        assert turbo.generate(ps[0], _greedy()).token_ids == alone[0]
    assert mixed.wait_idle()
    mixed.blocks.reset_prefix_cache()
    assert mixed.blocks.num_free_blocks() == mixed.blocks.num_total_blocks()


def test_codecs_give_different_tokens_somewhere(mixed):
    """The classes really store different precisions (else the test above proves nothing)."""
    p = _prompts(1, seed=9, length=60)[0]
    outs = {str(kv): mixed.generate(p, _greedy(kv, n=24, logprobs=1)) for kv in KVS[:3]}
    lp = [[t.logprob for t in r.logprobs] for r in outs.values()]
    assert lp[0] != lp[1] and lp[1] != lp[2]


def test_start_keeps_the_first_blocks_native(mixed, hd64_dir):
    p = _prompts(1, seed=5, length=70)[0]
    h = mixed.submit(p, _greedy({"codec": "turbo", "start": 20}, n=30))
    first = next(iter(h))
    assert first is not None
    table = mixed.blocks.block_tables(h.request_id)["full"]
    pool = mixed.blocks.pools["full"]
    # 20 rounds up to 2 blocks of 16: native, the rest in the turbo class
    assert [pool.cls_of(b) for b in table[:2]] == ["", ""]
    assert {pool.cls_of(b) for b in table[2:]} == {mixed.kv_codec.id}
    r = Engine.collect(h)
    assert r.kv_cache == {"codec": "turbo-k8v3", "start": 20, "boundary": 32, "sliding": None}
    # a start past the whole request is all native: same tokens as a native pool
    with _engine(hd64_dir) as native:
        want = native.generate(p, _greedy(n=20)).token_ids
    got = mixed.generate(p, _greedy({"codec": "turbo", "start": 200}, n=20))
    assert got.token_ids == want and got.kv_cache["boundary"] == len(p) + 20 - 1


def test_reuse_only_at_the_stored_precision(mixed):
    mixed.blocks.reset_prefix_cache()
    p = _prompts(1, seed=11, length=80)[0]
    late = {"codec": "turbo", "start": 32}
    miss = mixed.generate(p, _greedy(late))
    assert miss.cached_tokens == 0
    # same codec and start: the whole prompt's full blocks are reused, same tokens
    hit = mixed.generate(p, _greedy(late))
    assert hit.cached_tokens == 79 and hit.token_ids == miss.token_ids  # 4 blocks + 15 rows copied
    # native asks for native everywhere: only the two native blocks below the boundary match
    assert mixed.generate(p, _greedy({"codec": "native"})).cached_tokens == 32
    # turbo from token 0: the first block was stored native, so nothing matches
    assert mixed.generate(p, _greedy({"codec": "turbo"})).cached_tokens == 0


def test_speculative_rollback_never_moves_the_boundary(hd64_dir):
    rep = ([5, 6, 7, 8, 9, 10, 11, 12] * 8)[:60]
    late = {"codec": "turbo", "start": 40}
    with _engine(hd64_dir, kv_quant="turbo", quantized_kv_start=40, spec="ngram", spec_adaptive=False) as e:
        assert e.blocks.class_names() == [e.kv_codec.id.removesuffix(";start=40"), ""]
        plain = e.generate(rep, _greedy(late, n=40, speculative=False))
        spec = e.generate(rep, _greedy(late, n=40))
        assert spec.speculation and spec.speculation["drafted"] > spec.speculation["accepted"] > 0
        assert spec.token_ids == plain.token_ids
        assert spec.kv_cache["boundary"] == plain.kv_cache["boundary"] == 48
        assert e.wait_idle()
        e.blocks.reset_prefix_cache()
        assert e.blocks.num_free_blocks() == e.blocks.num_total_blocks()


def test_unserved_codecs_are_a_clear_error(mixed, hd64_dir):
    with pytest.raises(ValueError, match="kv-extra-codecs"):
        mixed.submit([1, 2, 3], _greedy({"codec": "affine", "key_bits": 8}))
    with _engine(hd64_dir, kv_quant="turbo") as turbo, pytest.raises(ValueError, match="kv_cache.start"):
        turbo.submit([1, 2, 3], _greedy({"codec": "turbo", "start": 16}))


def test_ssd_round_trip_of_a_mixed_pool(hd64_dir, tmp_path):
    p = _prompts(1, seed=13, length=75)[0]
    late = _greedy({"codec": "turbo", "start": 32})
    kw = dict(kv_quant="turbo", kv_extra_codecs="native", ssd_cache_dir=str(tmp_path))
    with _engine(hd64_dir, **kw) as e:
        miss = e.generate(p + [7], late)
        assert e.flush_cache()["flushed"]
    with _engine(hd64_dir, **kw) as e2:
        r = e2.generate(p + [7], late)
        assert r.cached_tokens == 64 and e2.blocks.restored_blocks == 4
        assert r.token_ids == miss.token_ids


# ---- block manager: classes ------------------------------------------------------------------


def _bm(n_a=6, n_b=4, **kw):
    return BlockManager([KVGroup("full", n_a + n_b, None, (("a", n_a), ("b", n_b)))], 4, **kw)


def test_blocks_come_from_each_request_class():
    m = _bm()
    cl = BlockClasses(high="a", low="b", boundary=2)
    assert m.admit("r", list(range(13)), 100, classes=cl) == (0, 13)
    t = m.block_tables("r")["full"]
    assert [m.pools["full"].cls_of(b) for b in t] == ["b", "b", "a", "a"]
    assert m.grow("r", 20) and m.pools["full"].cls_of(m.block_tables("r")["full"][-1]) == "a"
    m.trim("r", 13)
    m.free("r")
    assert m.num_free_blocks(cls="a") == 6 and m.num_free_blocks(cls="b") == 4


def test_class_exhaustion_waits_without_taking_blocks():
    m = _bm(n_a=2, n_b=8)
    assert m.admit("r", list(range(20)), 100, classes=BlockClasses(high="a")) is None
    assert m.num_free_blocks() == 10


def test_the_class_is_part_of_the_hash():
    toks = list(range(8))
    a = chain_hashes(toks, 4, "ns", classes=BlockClasses(high="a"))
    b = chain_hashes(toks, 4, "ns", classes=BlockClasses(high="a", low="b", boundary=1))
    assert a[0] != b[0] and a[1] != b[1]
    assert chain_hashes(toks, 4, "ns", classes=BlockClasses()) == chain_hashes(toks, 4, "ns")
