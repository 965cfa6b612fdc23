"""Tokenizer.from_hf_dir: tokenizer.json + tokenizer_config.json + template files + generation_config.json."""

from __future__ import annotations

import json

import pytest
from tok_fixtures import gpt2_metadata
from tokenizers import processors

from augury.tokenizer import Tokenizer

TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"


def make_dir(path, config: dict, post_bos: bool = False, files: dict | None = None):
    backend = Tokenizer.from_gguf_metadata(gpt2_metadata()).backend
    if post_bos:
        backend.post_processor = processors.TemplateProcessing(
            single="<|im_start|> $A", special_tokens=[("<|im_start|>", 1)])
    backend.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    for name, content in (files or {}).items():
        (path / name).write_text(content if isinstance(content, str) else json.dumps(content))
    return Tokenizer.from_hf_dir(str(path))


def test_config_fields(tmp_path):
    tok = make_dir(tmp_path, {"bos_token": {"content": "<|im_start|>"}, "eos_token": "<|im_end|>",
                              "add_bos_token": True, "chat_template": TEMPLATE},
                   files={"generation_config.json": {"eos_token_id": [2, 0]}})
    assert (tok.bos_token_id, tok.eos_token_id, tok.add_bos) == (1, 2, True)
    assert tok.encode("hello") == [1, tok.token_to_id("hello")]
    assert tok.eos_token_ids[:2] == [2, 0]
    assert tok.vocab_kind == "byte_level" and tok.chat_template_source == "model"
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}]) == "user: hi\n"


def test_post_processor_bos_is_detected_and_added_once(tmp_path):
    tok = make_dir(tmp_path, {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>"}, post_bos=True)
    assert tok.add_bos
    assert tok.encode("hello") == [1, tok.token_to_id("hello")]
    assert tok.encode("hello", add_special_tokens=False) == [tok.token_to_id("hello")]


@pytest.mark.parametrize("source", ["jinja", "json", "named"])
def test_chat_template_sources(tmp_path, source):
    cfg = {"eos_token": "<|im_end|>"}
    files = {}
    if source == "jinja":
        files["chat_template.jinja"] = TEMPLATE
    elif source == "json":
        files["chat_template.json"] = {"chat_template": TEMPLATE}
    else:
        cfg["chat_template"] = [{"name": "tool_use", "template": "x"}, {"name": "default", "template": TEMPLATE}]
    tok = make_dir(tmp_path, cfg, files=files)
    assert tok.chat_template == TEMPLATE


def test_missing_tokenizer_json(tmp_path):
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        Tokenizer.from_hf_dir(str(tmp_path))
