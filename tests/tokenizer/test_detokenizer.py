"""StreamDetokenizer on tiny in-test vocabularies (byte-fallback SentencePiece and byte-level BPE)."""

from __future__ import annotations

import random

import pytest
from tok_fixtures import gpt2_metadata, spm_metadata

from augury.tokenizer import StreamDetokenizer, Tokenizer


@pytest.fixture(scope="module", params=["spm", "gpt2"])
def tok(request) -> Tokenizer:
    meta = spm_metadata() if request.param == "spm" else gpt2_metadata()
    return Tokenizer.from_gguf_metadata(meta)


def stream(det: StreamDetokenizer, ids: list[int]) -> tuple[list[str], bool]:
    chunks, stopped = [], False
    for i in ids:
        text, stopped = det.add(i)
        chunks.append(text)
        if stopped:
            break
    return chunks, stopped


@pytest.mark.parametrize("text", ["hi 😀 中文 ok", "😀😀", "中", "a\n\nb 🇫🇷 x", "world héllo ß"])
def test_multibyte_chars_split_across_tokens_are_never_emitted_partially(tok, text):
    ids = tok.encode(text, add_special_tokens=False)
    assert len(ids) > len(text.split()), "the vocabulary should split these characters into byte tokens"
    det = StreamDetokenizer(tok)
    chunks, stopped = stream(det, ids)
    tail = det.flush()
    assert not stopped
    assert all("\ufffd" not in c for c in chunks)
    assert "".join(chunks) + tail == text == det.text
    # the emoji's 4 byte tokens yield nothing until the last one completes it
    if text == "😀😀":
        assert chunks[:3] == ["", "", ""] and chunks[3] == "😀"


def test_random_texts_stream_equals_full_decode(tok):
    rng = random.Random(0)
    alphabet = list("helo wrd STOP,.!\n") + ["😀", "中", "é", "ß", "🇫", "  "]
    for _ in range(40):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 30)))
        ids = tok.encode(text, add_special_tokens=False)
        det = StreamDetokenizer(tok)
        chunks, _ = stream(det, ids)
        assert "".join(chunks) + det.flush() == tok.decode(ids) == text


@pytest.mark.parametrize("stop", ["lo wo", "o w", "d!"])
def test_stop_string_spanning_tokens(tok, stop):
    ids = tok.encode("hello world! and more text", add_special_tokens=False)
    det = StreamDetokenizer(tok, stop=[stop])
    chunks, stopped = stream(det, ids)
    full = tok.decode(ids)
    assert stopped and det.stopped and det.matched_stop == stop
    assert "".join(chunks) == full[: full.index(stop)] == det.text
    # further tokens and flush add nothing once stopped
    assert det.add(ids[-1]) == ("", True)
    assert det.flush() == ""


def test_earliest_stop_wins(tok):
    ids = tok.encode("hello world STOP", add_special_tokens=False)
    det = StreamDetokenizer(tok, stop=["STOP", "wor"])
    chunks, stopped = stream(det, ids)
    assert stopped and "".join(chunks) == "hello " and det.matched_stop == "wor"


def test_stop_string_at_the_very_start(tok):
    ids = tok.encode("hello world", add_special_tokens=False)
    det = StreamDetokenizer(tok, stop=["he"])
    chunks, stopped = stream(det, ids)
    assert stopped and det.text == "" and all(c == "" for c in chunks)


def test_possible_stop_prefix_is_held_and_released_by_flush(tok):
    ids = tok.encode("hello world", add_special_tokens=False)
    det = StreamDetokenizer(tok, stop=["world!"])
    chunks, stopped = stream(det, ids)
    assert not stopped
    assert "".join(chunks) == "hello "  # "world" could still become "world!"
    assert det.flush() == "world"
    assert det.text == "hello world"


def test_held_text_released_when_stop_prefix_breaks(tok):
    ids = tok.encode("hello wohello", add_special_tokens=False)
    det = StreamDetokenizer(tok, stop=["world"])
    chunks, stopped = stream(det, ids)
    assert not stopped
    assert "".join(chunks) + det.flush() == "hello wohello"


def test_skip_special_tokens(tok):
    turn_end = tok.token_to_id("<end_of_turn>") or tok.token_to_id("<|im_end|>")
    assert turn_end in tok.special_token_ids
    ids = tok.encode("hello", add_special_tokens=False) + [turn_end] + tok.encode(" world", add_special_tokens=False)
    skipped = StreamDetokenizer(tok)
    kept = StreamDetokenizer(tok, skip_special_tokens=False)
    a = "".join(stream(skipped, ids)[0]) + skipped.flush()
    b = "".join(stream(kept, ids)[0]) + kept.flush()
    assert a == "hello world"
    assert b == "hello" + tok.id_to_token(turn_end) + " world"


def test_prompt_context_keeps_leading_space_for_space_prefix_vocab():
    # with a "▁" prefix rule, a lone "▁w..." decodes without its space; prompt context restores it
    tok = Tokenizer.from_gguf_metadata(spm_metadata(add_space_prefix=True))
    prompt = tok.encode("hello")
    gen = tok.encode("hello world", add_special_tokens=False)[-3:]  # "▁w", "or", "ld"
    assert tok.id_to_token(gen[0]) == "\u2581w"
    bare = StreamDetokenizer(tok)
    ctx = StreamDetokenizer(tok, prompt_ids=prompt)
    assert "".join(stream(bare, gen)[0]) + bare.flush() == "world"
    assert "".join(stream(ctx, gen)[0]) + ctx.flush() == " world"
    assert ctx.text == tok.decode(prompt + gen)[len(tok.decode(prompt)):]
