"""Ground truth: our GGUF tensors equal transformers' own GGUF loader, name for name."""

from __future__ import annotations

import pytest
import torch

from augury.config import ModelConfig
from augury.weights.loader import load_checkpoint
from tests.conftest import hf_gguf_model


def _transformers_state(path) -> tuple[dict[str, torch.Tensor], object]:
    model = hf_gguf_model(str(path))  # shared with the engine oracle (tests/engine/test_real_engine.py)
    sd = dict(model.state_dict())
    if model.config.tie_word_embeddings:
        sd.pop("lm_head.weight", None)  # tied to the embedding; we do not emit it
    return sd, model.config


def _compare(path, tmp_path) -> None:
    ck = load_checkpoint(str(path), cache_dir=tmp_path, progress=False)
    ref, hf_cfg = _transformers_state(path)
    got = ck.state_dict()
    assert set(got) == set(ref)
    for k, v in ref.items():
        assert got[k].shape == v.shape, k
        assert torch.allclose(got[k], v, rtol=0, atol=1e-6), k
    ours, theirs = ModelConfig.from_hf_dict(ck.config), ModelConfig.from_hf_dict(hf_cfg.to_dict())
    assert ours == theirs


@pytest.mark.real
def test_smollm2_matches_transformers(smollm2_gguf, tmp_path) -> None:
    _compare(smollm2_gguf, tmp_path)


@pytest.mark.real
@pytest.mark.slow
def test_gemma3_matches_transformers(gemma3_gguf, tmp_path) -> None:
    _compare(gemma3_gguf, tmp_path)
