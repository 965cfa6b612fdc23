"""Gemma 3 (text) vs HF transformers fp32: sandwich norms, q/k norm, scaled embeddings,
sliding-window layers with their own rope base, contexts longer than the window with
released (-1) sliding blocks."""

import pytest
import torch

pytest.importorskip("transformers")

from oracle_helpers import (  # noqa: E402
    Driver, check_bf16, check_decode, check_prefill, check_ragged, close, hf_and_augury, hf_logits, prompt,
)


def gemma3_config(**kw):
    from transformers import Gemma3TextConfig

    base = dict(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
        sliding_window=8, query_pre_attn_scalar=24, rope_theta=100000.0, rope_local_base_freq=1000.0,
        layer_types=["sliding_attention", "full_attention", "sliding_attention", "sliding_attention"],
    )
    base.update(kw)
    return Gemma3TextConfig(**base)


@pytest.fixture(scope="module")
def gemma_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("gemma3")


@pytest.fixture(scope="module")
def gemma(gemma_dir):
    return hf_and_augury(gemma3_config(), gemma_dir, seed=5)


def test_bf16(gemma, gemma_dir):
    check_bf16(gemma[0], gemma_dir)


def test_config_parsed(gemma):
    _, model, cfg = gemma
    assert cfg.model_type == "gemma3_text" and cfg.tie_word_embeddings
    assert cfg.sliding_window == 8 and cfg.rope_local.theta == 1000.0 and cfg.rope.theta == 100000.0
    assert model.kv_group_of_layer() == ["sliding", "full", "sliding", "sliding"]
    assert model.kv_group_windows() == {"sliding": 8, "full": None}


def test_prefill_longer_than_window(gemma):
    hf, model, _ = gemma
    check_prefill(hf, model, n=29)


def test_decode_past_window_with_released_blocks(gemma):
    hf, model, _ = gemma
    check_decode(hf, model, n_prefill=6, n_decode=26)


def test_ragged_batch_with_released_blocks(gemma):
    hf, model, _ = gemma
    check_ragged(hf, model)


def test_sliding_blocks_really_released(gemma):
    """Chunked prefill across the window: tables hold -1 entries and the result still matches."""
    hf, model, _ = gemma
    ids = prompt(40, model.cfg.vocab_size, 9)
    d = Driver(model, block_size=4)
    rows = [d.step([("a", ids[lo:hi])])[0] for lo, hi in ((0, 9), (9, 21), (21, 22), (22, 35), (35, 40))]
    assert d.tables["a"]["sliding"][:9] == [-1] * 8 + [d.tables["a"]["sliding"][8]]  # (40-8+1)//4: blocks 0..7 released
    assert d.tables["a"]["sliding"][8] >= 0
    assert -1 not in d.tables["a"]["full"]
    close(torch.cat(rows), hf_logits(hf, ids), "chunked prefill past the window")


def test_final_logit_softcapping(tmp_path):
    hf, model, cfg = hf_and_augury(gemma3_config(final_logit_softcapping=0.7, num_hidden_layers=2,
                                                 layer_types=["sliding_attention", "full_attention"]),
                                   tmp_path, seed=6)
    assert cfg.final_logit_softcapping == 0.7
    check_prefill(hf, model, n=12)
