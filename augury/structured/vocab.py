"""Turn our tokenizer's vocabulary into what a grammar backend needs.

Grammar libraries match grammar bytes against token bytes, so they need each
token's surface form and the tokenizer family's encoding of it (GPT-2 style
byte-level "Ġ", SentencePiece "▁" + "<0x0A>" byte fallback, or raw text).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

VocabKind = Literal["raw", "byte_fallback", "byte_level"]

_BYTE_FALLBACK = re.compile(r"^<0x[0-9A-Fa-f]{2}>$")


@dataclass(frozen=True)
class VocabInfo:
    tokens: list[str]  # surface form per id, as the tokenizer stores it; "" for special tokens
    kind: VocabKind
    stop_token_ids: list[int]


def _token_list(tokenizer: Any) -> list[str]:
    n = int(tokenizer.vocab_size)
    get_vocab = getattr(tokenizer, "get_vocab", None)
    if callable(get_vocab):
        vocab = get_vocab()
        toks = [""] * n
        for s, i in vocab.items():
            if 0 <= i < n:
                toks[i] = s
        return toks
    return [tokenizer.id_to_token(i) or "" for i in range(n)]


def detect_kind(tokens: list[str]) -> VocabKind:
    """Guess the vocabulary encoding from the token strings themselves."""
    if sum(1 for t in tokens if _BYTE_FALLBACK.match(t)) >= 200:
        return "byte_fallback"
    # byte-level BPE maps space to "Ġ" and newline to "Ċ"; both are common token prefixes
    if sum(1 for t in tokens if t.startswith("Ġ")) >= 50:
        return "byte_level"
    return "raw"


def special_ids(tokenizer: Any) -> set[int]:
    """Ids the grammar must never produce as text (control tokens); eos handled separately."""
    for attr in ("special_token_ids", "all_special_ids"):
        ids = getattr(tokenizer, attr, None)
        if ids is not None:
            return {int(i) for i in ids}
    return set()


def vocab_info(tokenizer: Any) -> VocabInfo:
    tokens = _token_list(tokenizer)
    kind: VocabKind = getattr(tokenizer, "vocab_kind", None) or detect_kind(tokens)
    stops = [int(i) for i in getattr(tokenizer, "eos_token_ids", ()) or ()]
    for i in special_ids(tokenizer) | set(stops):
        if 0 <= i < len(tokens):
            tokens[i] = ""  # empty surface form = special: never matched as grammar text
    return VocabInfo(tokens=tokens, kind=kind, stop_token_ids=stops)
