"""HF model directories: sharded safetensors, names, values, errors, fingerprint."""

from __future__ import annotations

import json

import pytest
import torch

from augury.config import ModelConfig
from augury.weights.errors import WeightsError
from augury.weights.hf_dir import hf_param_name, load_hf_dir
from augury.weights.loader import load_checkpoint
from tests.weights.gguf_build import tiny_hf_model


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    cfg, model = tiny_hf_model("qwen3", vocab_size=128, hidden_size=64)
    d = tmp_path_factory.mktemp("hf")
    model.save_pretrained(d, max_shard_size="50KB")
    model.generation_config.eos_token_id = [1, 5]
    model.generation_config.save_pretrained(d)
    return d, model


def test_sharded_dir_loads(sharded) -> None:
    d, model = sharded
    assert (d / "model.safetensors.index.json").exists()
    assert len(list(d.glob("*.safetensors"))) > 2
    ck = load_checkpoint(str(d))
    assert ck.kind == "hf" and ck.source == str(d.resolve())
    got = ck.state_dict()
    ref = model.state_dict()
    assert set(got) == set(ref)
    for k, v in ref.items():
        assert torch.equal(got[k], v), k
    assert ck.generation_config["eos_token_id"] == [1, 5]
    assert ck.tokenizer_files == {"kind": "hf_dir", "path": str(d.resolve())}
    assert ModelConfig.from_hf_dict(ck.config).model_type == "qwen3"


def test_fingerprint_stable_and_sensitive(sharded, tmp_path) -> None:
    d, model = sharded
    assert load_hf_dir(d).fingerprint == load_hf_dir(d).fingerprint
    other = tmp_path / "other"
    with torch.no_grad():
        model.model.norm.weight.add_(1.0)
    model.save_pretrained(other, max_shard_size="50KB")
    with torch.no_grad():
        model.model.norm.weight.sub_(1.0)
    assert load_hf_dir(other).fingerprint != load_hf_dir(d).fingerprint


def test_single_file_and_tied(tmp_path) -> None:
    cfg, model = tiny_hf_model("llama", tie_word_embeddings=True)
    model.save_pretrained(tmp_path)
    (tmp_path / "generation_config.json").unlink(missing_ok=True)
    ck = load_hf_dir(tmp_path)
    assert ck.generation_config == {}
    got = ck.state_dict()
    assert "lm_head.weight" not in got  # tied: transformers does not save it
    assert torch.equal(got["model.embed_tokens.weight"], model.model.embed_tokens.weight)


def test_errors(tmp_path) -> None:
    with pytest.raises(WeightsError, match="no config.json"):
        load_hf_dir(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(WeightsError, match="no weights"):
        load_hf_dir(tmp_path)
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"a": "model-00001-of-00002.safetensors"}})
    )
    with pytest.raises(WeightsError, match="missing"):
        load_hf_dir(tmp_path)


def test_multimodal_names() -> None:
    assert hf_param_name("model.language_model.layers.0.mlp.up_proj.weight") == "model.layers.0.mlp.up_proj.weight"
    assert hf_param_name("language_model.model.norm.weight") == "model.norm.weight"
    assert hf_param_name("model.vision_tower.encoder.weight") is None
    assert hf_param_name("model.layers.0.self_attn.rotary_emb.inv_freq") is None
    assert hf_param_name("lm_head.weight") == "lm_head.weight"
