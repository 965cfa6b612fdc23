"""Build a HF `tokenizers` backend from a GGUF file's `tokenizer.*` metadata.

Two vocabulary kinds exist in the files we load:
- "gpt2": byte-level BPE (tokens + merges), pre-split by a regex named by `tokenizer.ggml.pre`.
- "llama": SentencePiece-style BPE (tokens + scores + token types, no merges): spaces are "▁",
  unknown bytes fall back to "<0xXX>" tokens, and merges are recovered from the vocabulary order.
The reference is transformers' GGUF tokenizer loader, which these builders match token for token.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers
from tokenizers import Tokenizer as Backend

# llama.cpp token types (gguf.TokenType)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

SPIECE_SPACE = "\u2581"  # "▁": SentencePiece's spelling of a space

_GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_GPT4O_SPLIT = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# `tokenizer.ggml.pre` -> (split digits one by one first, split regex). Unknown names get GPT-2's.
PRE_TOKENIZER_SPLITS: dict[str, tuple[bool, str]] = {
    "default": (False, _GPT2_SPLIT),
    "gpt2": (False, _GPT2_SPLIT),
    "gpt-2": (False, _GPT2_SPLIT),
    # SmolLM was trained with every digit its own pre-token (llama.cpp splits `\p{N}` first)
    "smollm": (True, _GPT2_SPLIT),
    "llama3": (False, _LLAMA3_SPLIT),
    "llama-v3": (False, _LLAMA3_SPLIT),
    "llama-bpe": (False, _LLAMA3_SPLIT),
    "smaug-bpe": (False, _LLAMA3_SPLIT),
    "falcon3": (False, _LLAMA3_SPLIT),
    "dbrx": (False, _LLAMA3_SPLIT),
    "qwen2": (False, _QWEN2_SPLIT),
    "deepseek-r1-qwen": (False, _QWEN2_SPLIT),
    "qwen35": (False, _QWEN2_SPLIT),
    "gpt-4o": (False, _GPT4O_SPLIT),
    "llama4": (False, _GPT4O_SPLIT),
}


@dataclass
class GGUFVocab:
    """The `tokenizer.*` fields we use, normalized to plain Python values."""

    model: str  # "gpt2" | "llama"
    tokens: list[str]
    token_type: list[int]
    scores: list[float] | None = None
    merges: list[str] | None = None
    pre: str = "default"
    bos_id: int | None = None
    eos_id: int | None = None
    unk_id: int | None = None
    pad_id: int | None = None
    add_bos: bool = False
    add_eos: bool = False
    add_space_prefix: bool = False
    chat_template: str | None = None
    architecture: str | None = None
    extra_eos_ids: list[int] = field(default_factory=list)  # tokenizer.ggml.eot_token_id / eom / eog

    @classmethod
    def from_metadata(cls, meta: dict[str, Any], architecture: str | None = None) -> "GGUFVocab":
        def g(key: str, default: Any = None) -> Any:
            return meta.get(f"tokenizer.ggml.{key}", default)

        model = g("model")
        if model not in ("gpt2", "llama"):
            raise ValueError(f"unsupported GGUF tokenizer model {model!r} (supported: 'gpt2', 'llama')")
        tokens = list(g("tokens") or [])
        if not tokens:
            raise ValueError("GGUF metadata has no tokenizer.ggml.tokens")
        types = list(g("token_type") or [NORMAL] * len(tokens))
        add_bos = g("add_bos_token")
        if add_bos is None:
            # llama.cpp adds BOS to SentencePiece vocabularies that do not say otherwise
            add_bos = model == "llama"
        extra = [int(g(k)) for k in ("eot_token_id", "eom_token_id") if g(k) is not None]
        return cls(
            model=model,
            tokens=tokens,
            token_type=[int(t) for t in types],
            scores=list(g("scores")) if g("scores") is not None else None,
            merges=list(g("merges")) if g("merges") is not None else None,
            pre=g("pre") or "default",
            bos_id=_opt_int(g("bos_token_id")),
            eos_id=_opt_int(g("eos_token_id")),
            unk_id=_opt_int(g("unknown_token_id")),
            pad_id=_opt_int(g("padding_token_id")),
            add_bos=bool(add_bos),
            add_eos=bool(g("add_eos_token", False)),
            # llama.cpp's default for SentencePiece vocabularies is a leading "▁"
            add_space_prefix=bool(g("add_space_prefix", model == "llama")),
            chat_template=meta.get("tokenizer.chat_template"),
            architecture=architecture or meta.get("general.architecture") or _guess_architecture(tokens),
            extra_eos_ids=extra,
        )


def _guess_architecture(tokens: list[str]) -> str | None:
    """Callers that pass only `tokenizer.*` fields lose the architecture; Gemma 3's vocabulary is
    recognizable (turn markers plus the image markers Gemma 3 introduced)."""
    head = set(tokens[:512])
    if {"<start_of_turn>", "<end_of_turn>"} <= head and "<start_of_image>" in tokens:
        return "gemma3"
    return None


def _opt_int(v: Any) -> int | None:
    return None if v is None else int(v)


def byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map (printable Latin-1 bytes map to themselves)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {b: chr(b) for b in keep}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)  # unprintable bytes move past Latin-1, in byte order
            extra += 1
    return table


def _gpt2_backend(v: GGUFVocab) -> Backend:
    spell = byte_to_unicode()
    alphabet = set(spell.values())
    # A few converters store tokens as raw text; respell those in the byte alphabet the merges use.
    vocab = {
        (t if set(t) <= alphabet else "".join(spell[b] for b in t.encode("utf-8"))): i
        for i, t in enumerate(v.tokens)
    }
    merges = [tuple(m.split(" ", 1)) for m in (v.merges or [])]
    bpe = models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False)
    tok = Backend(bpe)
    digits, split = PRE_TOKENIZER_SPLITS.get(v.pre, PRE_TOKENIZER_SPLITS["default"])
    steps: list[Any] = [pre_tokenizers.Digits(individual_digits=True)] if digits else []
    steps += [
        pre_tokenizers.Split(Regex(split), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ]
    tok.pre_tokenizer = pre_tokenizers.Sequence(steps)
    tok.decoder = decoders.ByteLevel()
    _add_special_tokens(tok, v, vocab, alphabet)
    return tok


def _respell_spaces(tokens: list[str]) -> list[str]:
    """Gemma files store multi-space tokens as real spaces; the text side sees them as "▁" runs."""
    present = set(tokens)
    out = []
    for t in tokens:
        if t and set(t) == {" "} and SPIECE_SPACE * len(t) not in present:
            t = SPIECE_SPACE * len(t)
        out.append(t)
    return out


def derive_merges(tokens: list[str], rank: list[float]) -> list[tuple[str, str]]:
    """BPE merges implied by a SentencePiece vocabulary: every way to cut a token into two
    vocabulary pieces, best-ranked token first (lower rank = merged earlier), and within one
    token the longer left piece first."""
    index = {t: i for i, t in enumerate(tokens)}
    found: list[tuple[float, int, str, str]] = []
    for t, i in index.items():
        for cut in range(len(t) - 1, 0, -1):
            left, right = t[:cut], t[cut:]
            if left in index and right in index:
                found.append((rank[i], -cut, left, right))
    found.sort(key=lambda x: (x[0], x[1]))
    return [(left, right) for _, _, left, right in found]


def _is_gemma(v: GGUFVocab) -> bool:
    return (v.architecture or "").startswith("gemma") or "<start_of_turn>" in v.tokens[:1024]


def _spm_backend(v: GGUFVocab) -> Backend:
    tokens = _respell_spaces(v.tokens)
    vocab = {t: i for i, t in enumerate(tokens)}
    if _is_gemma(v) or not v.scores:
        # Gemma's scores do not follow its merge order; the order tokens appear in the file does.
        rank: list[float] = [float(i) for i in range(len(tokens))]
    else:
        rank = [-float(s) for s in v.scores]
    unk = tokens[v.unk_id] if v.unk_id is not None and v.unk_id < len(tokens) else None
    bpe = models.BPE(
        vocab=vocab, merges=derive_merges(tokens, rank), unk_token=unk, fuse_unk=True, byte_fallback=True
    )
    tok = Backend(bpe)
    steps: list[Any] = [decoders.Replace(SPIECE_SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    if v.add_space_prefix:
        # "▁" before the first word only; decoding strips that one space again
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement=SPIECE_SPACE, prepend_scheme="first", split=False)
        steps.append(decoders.Strip(content=" ", left=1, right=0))
    else:
        # SentencePiece sees the whole text as one word: no pre-split, so "▁▁" tokens can form
        tok.normalizer = normalizers.Replace(" ", SPIECE_SPACE)
    tok.decoder = decoders.Sequence(steps)
    _add_special_tokens(tok, v, vocab, None, tokens)
    return tok


def _add_special_tokens(
    tok: Backend, v: GGUFVocab, vocab: dict[str, int], alphabet: set[str] | None, tokens: list[str] | None = None
) -> None:
    """Control tokens become special (matched whole in text, skipped on decode); user-defined ones
    become plain added tokens (matched whole, decoded as text)."""
    spelled = tokens if tokens is not None else v.tokens
    control, user = [], []
    for i, (t, ty) in enumerate(zip(v.tokens, v.token_type)):
        if ty == CONTROL:
            # In a byte-level vocabulary a control token outside the byte alphabet is a converter
            # mislabel; adding it would grow the vocabulary past the model's embedding size.
            if alphabet is None or set(t) <= alphabet:
                control.append(AddedToken(t, special=True, normalized=False))
        elif ty == USER_DEFINED and vocab.get(spelled[i]) == i and spelled[i] == t:
            user.append(AddedToken(t, special=False, normalized=False))
    if control:
        tok.add_special_tokens(control)
    if user:
        tok.add_tokens(user)


def build_backend(v: GGUFVocab) -> Backend:
    """The `tokenizers` object for this vocabulary (no BOS/EOS post-processing: callers add them)."""
    return _gpt2_backend(v) if v.model == "gpt2" else _spm_backend(v)
