"""GGUF tokenizer construction on tiny vocabularies: encode/decode rules, specials, metadata reading,
and parity with transformers' own GGUF tokenizer loader on the same tiny files."""

from __future__ import annotations

import os

import pytest
from tok_fixtures import SP, gpt2_metadata, spm_metadata, write_gguf

from augury.tokenizer import Tokenizer, read_gguf_metadata
from augury.tokenizer.gguf_vocab import derive_merges

TEXTS = [
    "hello world", "hello  world STOP", "  lead", "trail  ", "hi 😀 中文\n\nok", "\n", "", "x\ty",
    "<start_of_turn>user\nhello<end_of_turn>", "<|im_start|>user\nhello<|im_end|>", "12 345 world",
    "<bos>hello<eos>", "héllo wörld ß 🇫🇷",
]


@pytest.fixture(scope="module")
def spm() -> Tokenizer:
    return Tokenizer.from_gguf_metadata(spm_metadata())


@pytest.fixture(scope="module")
def gpt2() -> Tokenizer:
    return Tokenizer.from_gguf_metadata(gpt2_metadata())


def test_spm_pieces_spaces_and_byte_fallback(spm):
    ids = spm.encode("hello  world 😀")
    toks = [spm.id_to_token(i) for i in ids]
    assert toks[:2] == ["<bos>", "hello"]
    assert toks[2:6] == [SP, SP + "w", "or", "ld"]  # a double space: "▁" + "▁w" (no pre-split on spaces)
    assert toks[-4:] == ["<0xF0>", "<0x9F>", "<0x98>", "<0x80>"]  # emoji via byte fallback
    assert spm.decode(ids) == "hello  world 😀"
    assert spm.decode(ids, skip_special_tokens=False) == "<bos>hello  world 😀"


def test_spm_specials_bos_and_stop_ids(spm):
    assert spm.add_bos and spm.bos_token_id == 2 and spm.vocab_kind == "byte_fallback"
    assert spm.encode("hello")[0] == 2 and spm.encode("hello", add_special_tokens=False)[0] != 2
    # control tokens are matched whole; the user-defined "\n" too, but decodes as text
    ids = spm.encode("<start_of_turn>user\nhi<end_of_turn>", add_special_tokens=False)
    assert ids[0] == 4 and ids[-1] == 5 and 6 in ids
    assert spm.decode(ids) == "user\nhi"
    assert 4 in spm.special_token_ids and 6 not in spm.special_token_ids
    assert spm.eos_token_ids == [1, 5]  # <eos> and <end_of_turn>


def test_spm_space_prefix_variant():
    tok = Tokenizer.from_gguf_metadata(spm_metadata(add_space_prefix=True))
    ids = tok.encode("hello world", add_special_tokens=False)
    assert tok.id_to_token(ids[0]).startswith(SP)
    assert tok.decode(ids) == "hello world"


def test_gguf_space_tokens_are_respelled():
    meta = spm_metadata()
    meta["tokenizer.ggml.tokens"] = [t if t != SP + SP else "  " for t in meta["tokenizer.ggml.tokens"]]
    tok = Tokenizer.from_gguf_metadata(meta)
    ids = tok.encode("a  b", add_special_tokens=False)
    assert tok.id_to_token(ids[1]) == SP + SP and tok.decode(ids) == "a  b"


def test_derive_merges_order():
    tokens = ["a", "b", "c", "ab", "bc", "abc"]
    merges = derive_merges(tokens, [float(i) for i in range(len(tokens))])
    # best-ranked merged token first; within "abc" the longer left piece first
    assert merges == [("a", "b"), ("b", "c"), ("ab", "c"), ("a", "bc")]


def test_gpt2_byte_level_and_smollm_digit_split(gpt2):
    assert gpt2.vocab_kind == "byte_level" and not gpt2.add_bos
    ids = gpt2.encode("hello world")
    assert [gpt2.id_to_token(i) for i in ids] == ["hello", "Ġworld"]
    assert gpt2.decode(gpt2.encode("hi 😀 中文\n")) == "hi 😀 中文\n"
    assert gpt2.eos_token_ids == [2, 0]  # <|im_end|>, then <|endoftext|>


def test_pre_tokenizer_follows_pre_name():
    meta = gpt2_metadata()
    meta["tokenizer.ggml.tokens"] = meta["tokenizer.ggml.tokens"] + ["12"]
    meta["tokenizer.ggml.token_type"] = meta["tokenizer.ggml.token_type"] + [1]
    meta["tokenizer.ggml.merges"] = meta["tokenizer.ggml.merges"] + ["1 2"]
    smollm = Tokenizer.from_gguf_metadata(meta)
    gpt2 = Tokenizer.from_gguf_metadata({**meta, "tokenizer.ggml.pre": "gpt2"})
    assert [smollm.id_to_token(i) for i in smollm.encode("12")] == ["1", "2"]  # digits split first
    assert [gpt2.id_to_token(i) for i in gpt2.encode("12")] == ["12"]


def test_unsupported_model_is_a_clear_error():
    with pytest.raises(ValueError, match="unsupported GGUF tokenizer model"):
        Tokenizer.from_gguf_metadata({**gpt2_metadata(), "tokenizer.ggml.model": "bert"})


def test_metadata_reader_roundtrip(tmp_path):
    meta = spm_metadata()
    path = write_gguf(str(tmp_path / "tiny.gguf"), meta)
    got = read_gguf_metadata(path)
    assert got["general.architecture"] == "tinyspm"
    for k, v in meta.items():
        assert got[k] == v, k
    with pytest.raises(ValueError, match="not a GGUF"):
        (tmp_path / "bad.gguf").write_bytes(b"nope" * 10)
        read_gguf_metadata(str(tmp_path / "bad.gguf"))


@pytest.mark.parametrize("kind", ["spm", "gpt2"])
def test_parity_with_transformers_gguf_loader_on_tiny_files(tmp_path, kind):
    transformers = pytest.importorskip("transformers")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    meta = spm_metadata() if kind == "spm" else gpt2_metadata()
    if kind == "spm":
        meta = {**meta, "general.architecture": "gemma3"}
    write_gguf(str(tmp_path / "t.gguf"), meta)
    ref = transformers.AutoTokenizer.from_pretrained(str(tmp_path), gguf_file="t.gguf")
    ours = Tokenizer.from_gguf_file(str(tmp_path / "t.gguf"))
    for text in TEXTS:
        assert ours.encode(text) == ref.encode(text), text
        ids = ref.encode(text)
        for skip in (True, False):
            assert ours.decode(ids, skip) == ref.decode(ids, skip_special_tokens=skip), text
