"""Chat templates render exactly as transformers' apply_chat_template(tokenize=False) renders them."""

from __future__ import annotations

import json
import os

import pytest
from tok_fixtures import gpt2_metadata, spm_metadata

from augury.tokenizer import ChatTemplateError, NoChatTemplateError, Tokenizer
from augury.tokenizer.chat_template import GEMMA3_TEMPLATE, template_reads_content_parts

CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# Exercises HF's environment: trim/lstrip blocks, tojson options, namespace, loop controls,
# raise_exception, strftime_now, bos/eos variables, tools, extra kwargs, {% generation %}.
RICH = """{{ bos_token }}
{% set ns = namespace(n=0) %}
{% if tools %}
    Tools: {{ tools | tojson }}
    Pretty: {{ tools[0] | tojson(indent=2, sort_keys=True) }}
{% endif %}
{% for m in messages %}
    {% if m['role'] not in ['system', 'user', 'assistant', 'tool'] %}
        {{ raise_exception('bad role ' + m['role']) }}
    {% endif %}
    {% if m['role'] == 'tool' %}{% continue %}{% endif %}
    {% set ns.n = ns.n + 1 %}
    <{{ m['role'] }}>
    {% if m['role'] == 'assistant' %}{% generation %}{{ m['content'] | default('') }}{% endgeneration %}
    {% else %}{{ m['content'] }}{% endif %}
    {% if m.tool_calls is defined %}{{ m.tool_calls | tojson }}{% endif %}
</{{ m['role'] }}>
{% endfor %}
count={{ ns.n }} year_len={{ strftime_now('%Y') | length }} think={{ enable_thinking | default('unset') }}
{% if add_generation_prompt %}<assistant>{% endif %}{{ eos_token if not add_generation_prompt else '' }}"""

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Météo <b>&</b> “quotes”",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                          "required": ["city"]}}}]

CONVERSATIONS = [
    [{"role": "user", "content": "Hi there"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"}],
    [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! How can I help?"},
     {"role": "user", "content": "Tell me a joke 😀 about 中文"}],
    [{"role": "user", "content": "Weather in Paris?"},
     {"role": "assistant", "content": None, "tool_calls": [{"type": "function", "function": {
         "name": "get_weather", "arguments": {"city": "Paris"}}}]},
     {"role": "tool", "content": "{\"temp\": 21}"}, {"role": "user", "content": "Thanks"}],
]


def hf_tokenizer(tmp_path, template: str):
    transformers = pytest.importorskip("transformers")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    ours = Tokenizer.from_gguf_metadata(gpt2_metadata())
    ours.backend.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "chat_template": template,
        "tokenizer_class": "PreTrainedTokenizerFast"}))
    return transformers.AutoTokenizer.from_pretrained(str(tmp_path)), Tokenizer.from_hf_dir(str(tmp_path))


@pytest.mark.parametrize("template", [CHATML, RICH], ids=["chatml", "rich"])
def test_render_matches_transformers(tmp_path, template):
    ref, ours = hf_tokenizer(tmp_path, template)
    for conv in CONVERSATIONS:
        if template == CHATML and any(m["content"] is None for m in conv):
            continue  # a bare ChatML template cannot render tool calls (in either implementation)
        for agp in (True, False):
            for tools in (None, TOOLS):
                kw = {"enable_thinking": False} if tools else {}
                want = ref.apply_chat_template(conv, tools=tools, add_generation_prompt=agp, tokenize=False, **kw)
                got = ours.apply_chat_template(conv, tools=tools, add_generation_prompt=agp, **kw)
                assert got == want


def test_template_exception_is_a_chat_template_error():
    tok = Tokenizer.from_gguf_metadata(gpt2_metadata(template=RICH))
    with pytest.raises(ChatTemplateError, match="bad role robot"):
        tok.apply_chat_template([{"role": "robot", "content": "beep"}])


def test_text_parts_are_joined_for_string_templates():
    tok = Tokenizer.from_gguf_metadata(gpt2_metadata(template=CHATML))
    msgs = [{"role": "user", "content": [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}]}]
    assert tok.apply_chat_template(msgs) == "<|im_start|>user\none\ntwo<|im_end|>\n<|im_start|>assistant\n"
    with pytest.raises(ChatTemplateError, match="image_url"):
        tok.apply_chat_template([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}])


def test_parts_aware_templates_get_the_list():
    assert template_reads_content_parts(GEMMA3_TEMPLATE)
    assert not template_reads_content_parts(CHATML)
    tok = Tokenizer.from_gguf_metadata({**spm_metadata(), "general.architecture": "gemma3"})
    msgs = [{"role": "user", "content": [{"type": "text", "text": " hi "}, {"type": "image"}]}]
    assert tok.apply_chat_template(msgs) == "<bos><start_of_turn>user\nhi<start_of_image><end_of_turn>\n<start_of_turn>model\n"


def test_gemma3_fallback_template():
    tok = Tokenizer.from_gguf_metadata({**spm_metadata(), "general.architecture": "gemma3"})
    assert tok.chat_template_source == "fallback:gemma3"
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Bye"}]
    assert tok.apply_chat_template(msgs) == (
        "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello!<end_of_turn>\n"
        "<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n"
    )
    with pytest.raises(ChatTemplateError, match="alternate"):
        tok.apply_chat_template([{"role": "assistant", "content": "x"}])
    # the template writes <bos> itself: encode_chat must not add a second one
    ids = tok.encode_chat(msgs)
    assert ids[0] == tok.bos_token_id and ids[1] != tok.bos_token_id


def test_no_template_is_a_clear_error():
    tok = Tokenizer.from_gguf_metadata(spm_metadata())  # architecture "tinyspm": no fallback
    assert tok.chat_template is None and tok.chat_template_source is None
    with pytest.raises(NoChatTemplateError, match="no chat template.*raw prompt"):
        tok.apply_chat_template([{"role": "user", "content": "hi"}])


def test_encode_chat_adds_bos_only_when_missing():
    tok = Tokenizer.from_gguf_metadata({**spm_metadata(), "tokenizer.chat_template": CHATML.replace("<|im_start|>", "<start_of_turn>").replace("<|im_end|>", "<end_of_turn>")})
    ids = tok.encode_chat([{"role": "user", "content": "hello"}])
    assert ids[0] == tok.bos_token_id and ids.count(tok.bos_token_id) == 1
    assert tok.decode(ids) == "user\nhello\nassistant\n"


def test_gemma3_is_recognized_without_architecture_field():
    # the weights loader may hand over only the tokenizer.* fields
    meta = {k: v for k, v in spm_metadata().items() if k.startswith("tokenizer.")}
    assert Tokenizer.from_gguf_metadata(meta).chat_template is None
    meta["tokenizer.ggml.tokens"] = meta["tokenizer.ggml.tokens"] + ["<start_of_image>"]
    meta["tokenizer.ggml.token_type"] = meta["tokenizer.ggml.token_type"] + [3]
    meta["tokenizer.ggml.scores"] = meta["tokenizer.ggml.scores"] + [0.0]
    tok = Tokenizer.from_gguf_metadata(meta)
    assert tok.architecture == "gemma3" and tok.chat_template_source == "fallback:gemma3"
