"""Prefix cache end to end on a tiny random llama: RAM hit, SSD hit after a restart and a
partial-block hit give the miss's greedy tokens; byte budgets; namespaces; multi-turn
reuse; draft-model companion state; the admin flush route. Invariant 3."""

from __future__ import annotations

import pytest
import torch

from augury.engine.engine import Engine
from augury.engine.types import SamplingParams
from tests.conftest import device_under_test

GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)


def make_engine(path, **kw) -> Engine:
    kw.setdefault("kv_budget", "4MiB")
    kw.setdefault("dtype", "float32")
    kw.setdefault("progress", False)
    return Engine.from_model(str(path), device=str(device_under_test()), **kw)


def prompt(n: int, seed: int = 3) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 300, (n,), generator=g).tolist()


@pytest.fixture(scope="module")
def cold(tiny_llama_dir):
    """Greedy tokens with the prefix cache off: the reference."""
    e = make_engine(tiny_llama_dir, enable_prefix_caching=False)
    yield lambda ids: e.generate(ids, GREEDY).token_ids
    e.shutdown()


def test_ram_hit_same_tokens_and_reported(tiny_llama_dir, cold):
    p = prompt(70)
    with make_engine(tiny_llama_dir) as e:
        a = e.generate(p, GREEDY)
        b = e.generate(p, GREEDY)
        assert a.cached_tokens == 0 and b.cached_tokens == 69  # all but the last prompt token
        assert a.token_ids == b.token_ids == cold(p)
        c = e.generate(p[:40] + prompt(9, seed=8), GREEDY)  # shares 40 tokens: 2 blocks + 8 copied
        assert c.cached_tokens == 40
        assert c.token_ids == cold(p[:40] + prompt(9, seed=8))
        assert e.stats()["prefix_cache_partial_hit_tokens"] >= 8


def test_partial_last_block_hit_is_exact(tiny_llama_dir, cold):
    p = prompt(37)  # 2 full blocks + 5 tokens: the 5 live in a partial block
    with make_engine(tiny_llama_dir) as e:
        first = e.generate(p, SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True))
        assert first.cached_tokens == 0
        q = p + prompt(6, seed=9)
        r = e.generate(q, GREEDY)
        assert r.cached_tokens == 37  # 32 whole-block tokens + 5 copy-on-write rows
        assert r.token_ids == cold(q)


def test_ssd_hit_after_restart(tiny_llama_dir, cold, tmp_path):
    p = prompt(90, seed=4)
    with make_engine(tiny_llama_dir, ssd_cache_dir=str(tmp_path)) as e:
        assert e.generate(p, GREEDY).token_ids == cold(p)
        st = e.flush_cache()
        assert st["flushed"] and st["prefix_cache_ssd_files"] >= 5
    with make_engine(tiny_llama_dir, ssd_cache_dir=str(tmp_path)) as e2:  # a fresh process's view
        assert e2.stats()["prefix_cache_ssd_files"] >= 5
        r = e2.generate(p + [7], GREEDY)
        assert r.cached_tokens == 80 and e2.blocks.restored_blocks == 5
        assert r.token_ids == cold(p + [7])


def test_ssd_never_serves_another_namespace(tiny_llama_dir, tmp_path):
    p = prompt(50, seed=5)
    with make_engine(tiny_llama_dir, ssd_cache_dir=str(tmp_path)) as e:
        e.generate(p, GREEDY)
        ns32 = e.namespace
    with make_engine(tiny_llama_dir, ssd_cache_dir=str(tmp_path), dtype="bfloat16") as e2:
        assert e2.namespace != ns32
        r = e2.generate(p + [1], GREEDY)
        assert r.cached_tokens == 0 and e2.blocks.restored_blocks == 0


def test_ram_byte_budget_is_counted(tiny_llama_dir):
    with make_engine(tiny_llama_dir, prompt_cache_bytes=0) as e:
        budget = 3 * e.prefix_cache.group_block_bytes("full")
        e.prefix_cache.set_ram_budget(budget)
        for s in range(4):
            e.generate(prompt(60, seed=20 + s), GREEDY)
        e.wait_idle()
        st = e.stats()
        assert st["prefix_cache_ram_cached_bytes"] <= budget
        assert st["prefix_cache_ram_cached_blocks"] == 3 and st["prefix_cache_ram_evicted_blocks"] > 0
        assert st["kv_blocks_free"] == st["kv_blocks_total"]


def test_persist_before_evict_keeps_blocks_restorable(tiny_llama_dir, cold, tmp_path):
    p = prompt(64, seed=6)
    with make_engine(tiny_llama_dir, ssd_cache_dir=str(tmp_path), prompt_cache_bytes=0) as e:
        e.prefix_cache.write_through = False  # only eviction writes to disk now
        e.generate(p, GREEDY)
        e.wait_idle()
        assert e.stats()["prefix_cache_ram_cached_blocks"] == 0  # budget 0: all evicted...
        e.flush_cache()
        assert e.stats()["prefix_cache_ssd_files"] >= 4  # ...but persisted first
        r = e.generate(p + [3], GREEDY)
        assert r.cached_tokens == 64 and r.token_ids == cold(p + [3])


def test_multi_turn_chat_reuses_turn_one(tiny_llama_dir, cold):
    """Turn 2 = turn 1's prompt + its answer + a new message. The rule: the answer's
    *generated ids* are the cached history; where the template's re-tokenization of the
    answer text differs, only the prefix up to the first differing id is reused."""
    with make_engine(tiny_llama_dir) as e:
        tok = e.tokenizer
        msgs = [{"role": "user", "content": "The quick brown fox jumps over the lazy dog. " * 3}]
        p1 = tok.encode_chat(msgs)
        r1 = e.generate(p1, SamplingParams(max_tokens=20, temperature=0.0))
        history = p1 + r1.token_ids  # generated ids, EOS included, as the cached history
        turn2 = history + tok.encode("\n<|im_start|>user\nAnd then?<|im_end|>\n<|im_start|>assistant\n",
                                     add_special_tokens=False)
        r2 = e.generate(turn2, GREEDY)
        # everything but the last generated token (never fed back) was cached
        assert r2.cached_tokens == len(history) - 1
        assert r2.token_ids == cold(turn2)
        # the re-rendered chat shares at least turn 1's whole prompt
        msgs2 = msgs + [{"role": "assistant", "content": r1.text}, {"role": "user", "content": "And then?"}]
        rendered = tok.encode_chat(msgs2)
        r3 = e.generate(rendered, GREEDY)
        assert r3.cached_tokens >= len(p1)
        assert r3.token_ids == cold(rendered)


def test_draft_model_companion_restored_with_target(tiny_llama_dir, tmp_path):
    p = prompt(75, seed=11)
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True,
                            speculative={"method": "draft-model", "num_draft_tokens": 4})
    plain = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True, speculative=False)
    # fixed draft lengths: a measured cost curve may say drafting a tiny model does not pay,
    # and then the draft model never runs (nothing of its KV to restore)
    kw = dict(draft_model=str(tiny_llama_dir), ssd_cache_dir=str(tmp_path), kv_budget="8MiB", spec_adaptive=False)
    with make_engine(tiny_llama_dir, **kw) as e:
        ref = e.generate(p, plain).token_ids
        assert e.generate(p, params).token_ids == ref
        e.flush_cache()
        ns = e.drafters["draft-model"].namespace
        assert ns.startswith(e.namespace + "/draft:")
    with make_engine(tiny_llama_dir, **kw) as e2:
        d = e2.drafters["draft-model"]
        r = e2.generate(p, params)
        assert r.token_ids == ref and r.cached_tokens == 64
        assert e2.blocks.restored_blocks == 4  # target blocks from SSD
        assert d.blocks.restored_blocks >= 4 and d.blocks.prefix_hit_tokens >= 64  # draft KV too
        assert e2.stats()["kv_blocks_free"] == e2.stats()["kv_blocks_total"]


def test_admin_flush_route(tiny_llama_dir, tmp_path):
    from fastapi.testclient import TestClient

    from augury.server.app import create_app

    with make_engine(tiny_llama_dir, ssd_cache_dir=str(tmp_path)) as e:
        e.generate(prompt(40, seed=12), GREEDY)
        with TestClient(create_app(e)) as c:
            r = c.post("/admin/cache/flush")
        assert r.status_code == 200
        body = r.json()
        assert body["flushed"] is True and body["prefix_cache_ssd_pending_writes"] == 0
        assert body["prefix_cache_ssd_files"] >= 2


def test_cli_cache_stats_and_clear(tiny_llama_dir, tmp_path, capsys):
    import json

    from augury.cli import main

    with make_engine(tiny_llama_dir, ssd_cache_dir=str(tmp_path)) as e:
        e.generate(prompt(40, seed=13), GREEDY)
    assert main(["cache", "stats", "--ssd-cache-dir", str(tmp_path), "--json"]) == 0
    st = json.loads(capsys.readouterr().out)
    assert st["files"] >= 2 and st["namespaces"] == 1 and st["unreadable"] == 0
    assert main(["cache", "clear", "--ssd-cache-dir", str(tmp_path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["removed_files"] == st["files"]
    assert main(["cache", "stats", "--ssd-cache-dir", str(tmp_path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["files"] == 0
