"""Parity with transformers' own GGUF tokenizer loader on the real SmolLM2 and Gemma 3 files."""

from __future__ import annotations

import os

import pytest
from tok_fixtures import gemma3_gguf, smollm2_gguf

from augury.tokenizer import StreamDetokenizer, Tokenizer, read_gguf_metadata
from tests.conftest import share_gguf_metadata_parses

pytestmark = pytest.mark.real

TEXTS = [
    "Hello world", "The quick brown fox jumps over the lazy dog.", "  leading spaces", "trailing   ",
    "multiple     spaces\tand\ttabs", "line1\nline2\n\n\nline3\r\n", "\n\n", " ", "",
    "def f(x):\n    return x ** 2  # square\n\nclass A:\n\tpass\n",
    "for (int i = 0; i < n; ++i) { a[i] = b[i] * 3.14159; }",
    "Numbers 1234567 and 3.14159, 1e-9, 0x1F, 2024-11-30",
    "Unicode: café, naïve, Ωmega, ß, Ünïcödé", "Emoji 😀👍🏽🇫🇷 👨‍👩‍👧 🦜",
    "中文测试，日本語のテキスト、한국어 문장", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 math ∑∫√∞ ≠ ≤", "\u00a0nbsp\u200bzero-width\u2028sep",
    "control \x01\x02\x7f chars", "don't you'll I'm we've THEY'RE",
    "<|im_start|>user\nhi<|im_end|>\n<|endoftext|>", "<start_of_turn>user\nhi<end_of_turn>\n<bos><eos><pad>",
    "<b>bold</b> </s> <unk> [multimodal]", "a" * 300, "ab " * 100,
    "Lorem ipsum dolor sit amet, consectetur adipiscing elit. " * 5,
]

CONVERSATIONS = [
    [{"role": "user", "content": "Hi there"}],
    [{"role": "system", "content": "You are a pirate."}, {"role": "user", "content": "Where is the treasure?"}],
    [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! How can I help?"},
     {"role": "user", "content": "Tell me a joke about 中文 😀"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"},
     {"role": "assistant", "content": "4"}, {"role": "user", "content": "3+3?"}],
]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]


def _load(found):
    if found is None:
        pytest.skip("real GGUF package not installed")
    transformers = pytest.importorskip("transformers")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    d, name = found
    share_gguf_metadata_parses()
    ours = Tokenizer.from_gguf_metadata(read_gguf_metadata(os.path.join(d, name)))
    ref = transformers.AutoTokenizer.from_pretrained(d, gguf_file=name)
    return ours, ref


@pytest.fixture(scope="module")
def smollm2():
    return _load(smollm2_gguf())


@pytest.fixture(scope="module")
def gemma3():
    return _load(gemma3_gguf())


def _check_encode_decode(ours, ref):
    assert ours.vocab_size == len(ref)
    for text in TEXTS:
        ids = ref.encode(text)
        assert ours.encode(text) == ids, text
        assert ours.encode(text, add_special_tokens=False) == ref.encode(text, add_special_tokens=False), text
        for skip in (True, False):
            assert ours.decode(ids, skip) == ref.decode(ids, skip_special_tokens=skip), text


def _check_stream(ours):
    for text in TEXTS:
        ids = ours.encode(text, add_special_tokens=False)
        det = StreamDetokenizer(ours)
        chunks = [det.add(i)[0] for i in ids]
        assert all("\ufffd" not in c for c in chunks), text
        assert "".join(chunks) + det.flush() == ours.decode(ids), text


def test_smollm2_encode_decode(smollm2):
    _check_encode_decode(*smollm2)


def test_smollm2_stream(smollm2):
    _check_stream(smollm2[0])


def test_smollm2_tokenizer_fields(smollm2):
    ours, _ = smollm2
    assert ours.bos_token_id == 1 and not ours.add_bos and ours.vocab_kind == "byte_level"
    assert ours.eos_token_ids[0] == 2  # <|im_end|> first, then <|endoftext|>
    assert ours.chat_template_source == "model"


def test_smollm2_chat_template(smollm2):
    ours, ref = smollm2
    for conv in CONVERSATIONS:
        for agp in (True, False):
            for tools in (None, TOOLS):
                want = ref.apply_chat_template(conv, tools=tools, add_generation_prompt=agp, tokenize=False)
                assert ours.apply_chat_template(conv, tools=tools, add_generation_prompt=agp) == want
                assert ours.encode_chat(conv, tools=tools, add_generation_prompt=agp) == ref.encode(
                    want, add_special_tokens=False)
    # SmolLM2's template supplies a default system prompt when the chat has none
    assert "You are a helpful AI assistant named SmolLM" in ours.apply_chat_template(CONVERSATIONS[0])


@pytest.mark.slow
def test_gemma3_encode_decode(gemma3):
    _check_encode_decode(*gemma3)


@pytest.mark.slow
def test_gemma3_stream_and_fields(gemma3):
    ours, _ = gemma3
    _check_stream(ours)
    assert ours.add_bos and ours.bos_token_id == 2 and ours.vocab_kind == "byte_fallback"
    assert ours.eos_token_ids == [1, ours.token_to_id("<end_of_turn>")]
    # its GGUF has no chat template: the built-in Gemma 3 one is used, and says so
    assert ours.chat_template_source == "fallback:gemma3"
    ids = ours.encode_chat([{"role": "user", "content": "Hi"}])
    assert ids[:2] == [2, ours.token_to_id("<start_of_turn>")] and ids.count(2) == 1
