"""Prompt builders, task sets and the limit arithmetic."""

import pytest
from fakes import FakeTokenizer

from augury.bench.model_facts import ModelFacts
from augury.bench.prompts import batch_prompts, filler_ids, load_task_set


def test_filler_has_exact_length_and_bos():
    tok = FakeTokenizer()
    for n in (8, 100, 1024, 4096):
        ids = filler_ids(tok, n)
        assert len(ids) == n and ids[0] == 1


def test_batch_prompts_differ_but_share_length():
    ps = batch_prompts(FakeTokenizer(), 4, 32)
    assert {len(p) for p in ps} == {32}
    assert len({tuple(p) for p in ps}) == 4


def test_task_sets_are_packaged():
    g = load_task_set("grounded")
    assert len(g) == 20 and len({t.id for t in g}) == 20
    kinds = {t.id.split("-")[0] for t in g}
    assert {"code", "repeat", "extract"} <= kinds
    assert len(load_task_set("chat")) >= 5
    assert all(t.messages[0]["role"] == "user" for t in g)
    with pytest.raises(ValueError):
        load_task_set("nope")


def test_limits():
    f = ModelFacts("m", weight_bytes=50_000_000, block_params=100, num_layers=1, num_heads=1, head_dim=2)
    assert f.decode_limit(40e9) == pytest.approx(800.0)
    assert f.decode_limit(40e9, batch=8) == pytest.approx(6400.0)
    # 2*100 weight FLOPs + 2*2*1*1*2*(10/2) attention FLOPs per token
    assert f.prefill_flops_per_token(10) == pytest.approx(240.0)
    assert f.prefill_limit(2400.0, 10) == pytest.approx(10.0)


@pytest.mark.real
def test_gguf_facts_on_smollm2():
    from augury.bench.model_facts import gguf_facts
    from augury.weights.errors import ModelNotFoundError
    from augury.weights.registry import resolve_model

    try:
        path = resolve_model("smollm2")
    except ModelNotFoundError:
        pytest.skip("needs `augury pull smollm2`")
    f = gguf_facts(path)
    assert f.num_layers == 30 and f.num_heads == 9 and f.head_dim == 64
    assert 80e6 < f.weight_bytes < 110e6  # Q4_1: about 4.5-5 bits a weight
