"""One tokenizer API over HF `tokenizer.json` directories and GGUF metadata.

BOS/EOS are added here, never by the backend's post-processor, so `encode` behaves the same
whichever source the tokenizer came from, and `encode_chat` can avoid a doubled BOS.
"""

from __future__ import annotations

import hashlib
import json
import os
from functools import cached_property
from typing import Any, Literal, Sequence

from tokenizers import Tokenizer as Backend

from augury.tokenizer.chat_template import FALLBACK_TEMPLATES, NoChatTemplateError, render_chat
from augury.tokenizer.gguf_vocab import GGUFVocab, build_backend

VocabKind = Literal["raw", "byte_fallback", "byte_level"]

# Special tokens that end a turn or a document in the families we know; a generated one means stop.
END_TOKEN_NAMES = (
    "<|im_end|>", "<end_of_turn>", "<|eot_id|>", "<|eom_id|>", "<|end|>", "<|endoftext|>",
    "<|end_of_text|>", "<|return|>", "<|END_OF_TURN_TOKEN|>", "<turn|>",
)


class Tokenizer:
    """Text <-> token ids, chat rendering, and the ids that stop generation."""

    def __init__(
        self,
        backend: Backend,
        *,
        bos_token_id: int | None,
        eos_token_id: int | None,
        extra_eos_ids: Sequence[int] = (),
        add_bos: bool = False,
        add_eos: bool = False,
        chat_template: str | None = None,
        chat_template_source: str | None = None,
        pad_token_id: int | None = None,
        unk_token_id: int | None = None,
        vocab_kind: VocabKind = "raw",
        architecture: str | None = None,
    ) -> None:
        self._backend = backend
        self.bos_token_id = bos_token_id
        self.eos_token_id = eos_token_id
        self.pad_token_id = pad_token_id
        self.unk_token_id = unk_token_id
        self.add_bos = add_bos
        self.add_eos = add_eos
        self.vocab_kind: VocabKind = vocab_kind
        self.architecture = architecture
        if chat_template is None and architecture in FALLBACK_TEMPLATES:
            chat_template, chat_template_source = FALLBACK_TEMPLATES[architecture], f"fallback:{architecture}"
        self.chat_template = chat_template
        # "model" | "fallback:<arch>" | None: the server can say when it used a built-in template
        self.chat_template_source = chat_template_source if chat_template else None
        decoder = backend.get_added_tokens_decoder()
        self.special_token_ids: set[int] = {i for i, t in decoder.items() if t.special}
        self.eos_token_ids = self._stop_ids(eos_token_id, list(extra_eos_ids))

    def _stop_ids(self, eos: int | None, extra: list[int]) -> list[int]:
        ids: list[int] = []
        for i in [eos, *extra, *(self.token_to_id(n) for n in END_TOKEN_NAMES)]:
            if i is None or i in ids:
                continue
            # named end tokens count only when special, so plain text like "</s>" never stops
            if i in (eos, *extra) or i in self.special_token_ids:
                ids.append(int(i))
        return ids

    # ---- construction ---------------------------------------------------------------------
    @classmethod
    def from_gguf_metadata(cls, meta: dict[str, Any], architecture: str | None = None) -> "Tokenizer":
        """From a GGUF file's `tokenizer.*` fields (plus `general.architecture` when present)."""
        v = GGUFVocab.from_metadata(meta, architecture)
        return cls(
            build_backend(v),
            bos_token_id=v.bos_id,
            eos_token_id=v.eos_id,
            extra_eos_ids=v.extra_eos_ids,
            add_bos=v.add_bos and v.bos_id is not None,
            add_eos=v.add_eos and v.eos_id is not None,
            chat_template=v.chat_template,
            chat_template_source="model" if v.chat_template else None,
            pad_token_id=v.pad_id,
            unk_token_id=v.unk_id,
            vocab_kind="byte_level" if v.model == "gpt2" else "byte_fallback",
            architecture=v.architecture,
        )

    @classmethod
    def from_gguf_file(cls, path: str) -> "Tokenizer":
        from augury.tokenizer.gguf_meta import read_gguf_metadata

        return cls.from_gguf_metadata(read_gguf_metadata(path))

    @classmethod
    def from_hf_dir(cls, path: str) -> "Tokenizer":
        """From a HF model directory: tokenizer.json, tokenizer_config.json, chat template files,
        generation_config.json (its eos ids are stop ids too)."""
        tj = os.path.join(path, "tokenizer.json")
        if not os.path.isfile(tj):
            raise FileNotFoundError(f"{path}: no tokenizer.json (slow/sentencepiece-only tokenizers are not supported)")
        backend = Backend.from_file(tj)
        cfg = _read_json(os.path.join(path, "tokenizer_config.json"))
        gen = _read_json(os.path.join(path, "generation_config.json"))
        cfg_model = _read_json(os.path.join(path, "config.json"))

        def tid(name: str) -> int | None:
            tok = _token_content(cfg.get(name))
            return backend.token_to_id(tok) if tok is not None else None

        bos, eos = tid("bos_token"), tid("eos_token")
        if eos is None:
            eos = _first_id(gen.get("eos_token_id")) if gen else _first_id(cfg_model.get("eos_token_id"))
        if bos is None:
            bos = _opt_int(gen.get("bos_token_id", cfg_model.get("bos_token_id")))
        add_bos, add_eos = _post_processor_adds(backend, bos, eos)
        if "add_bos_token" in cfg:
            add_bos = bool(cfg["add_bos_token"])
        if "add_eos_token" in cfg:
            add_eos = bool(cfg["add_eos_token"])
        template = _hf_chat_template(path, cfg)
        return cls(
            backend,
            bos_token_id=bos,
            eos_token_id=eos,
            extra_eos_ids=_id_list(gen.get("eos_token_id")),
            add_bos=add_bos and bos is not None,
            add_eos=add_eos and eos is not None,
            chat_template=template,
            chat_template_source="model" if template else None,
            pad_token_id=tid("pad_token"),
            unk_token_id=tid("unk_token"),
            vocab_kind=_detect_kind(backend),
            architecture=(cfg_model.get("model_type") or None),
        )

    # ---- vocabulary ---------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return self._backend.get_vocab_size(with_added_tokens=True)

    @property
    def backend(self) -> Backend:
        return self._backend

    def get_vocab(self) -> dict[str, int]:
        return self._backend.get_vocab(with_added_tokens=True)

    def id_to_token(self, i: int) -> str | None:
        return self._backend.id_to_token(int(i))

    def token_to_id(self, s: str) -> int | None:
        return self._backend.token_to_id(s)

    @property
    def bos_token(self) -> str | None:
        return self.id_to_token(self.bos_token_id) if self.bos_token_id is not None else None

    @property
    def eos_token(self) -> str | None:
        return self.id_to_token(self.eos_token_id) if self.eos_token_id is not None else None

    @cached_property
    def fingerprint(self) -> str:
        """Stable identity of the full tokenizer (vocab, merges, rules, BOS policy) for cache keys."""
        h = hashlib.sha256(self._backend.to_str().encode())
        h.update(f"|bos={self.bos_token_id}:{self.add_bos}|eos={self.eos_token_id}:{self.add_eos}".encode())
        return h.hexdigest()[:16]

    # ---- text <-> ids -------------------------------------------------------------------------
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text`; special-token strings in it are matched as those tokens."""
        ids = self._backend.encode(text, add_special_tokens=False).ids
        if add_special_tokens:
            if self.add_bos and self.bos_token_id is not None:
                ids.insert(0, self.bos_token_id)
            if self.add_eos and self.eos_token_id is not None:
                ids.append(self.eos_token_id)
        return ids

    def encode_batch(self, texts: list[str], add_special_tokens: bool = True) -> list[list[int]]:
        return [self.encode(t, add_special_tokens) for t in texts]

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._backend.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    # ---- chat -----------------------------------------------------------------------------------
    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        **kwargs: Any,
    ) -> str:
        if not self.chat_template:
            raise NoChatTemplateError(
                "this model has no chat template (its files carry none and none is built in for "
                f"architecture {self.architecture!r}); send a raw prompt (completions API) instead"
            )
        special = {
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
            "pad_token": self.id_to_token(self.pad_token_id) if self.pad_token_id is not None else None,
            "unk_token": self.id_to_token(self.unk_token_id) if self.unk_token_id is not None else None,
        }
        return render_chat(
            self.chat_template, messages, tools=tools, add_generation_prompt=add_generation_prompt,
            special_tokens=special, **kwargs,
        )

    def encode_chat(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        **kwargs: Any,
    ) -> list[int]:
        """Render then encode; BOS is prepended only when the template did not already emit it."""
        text = self.apply_chat_template(messages, tools=tools, add_generation_prompt=add_generation_prompt, **kwargs)
        ids = self.encode(text, add_special_tokens=False)
        if self.add_bos and self.bos_token_id is not None and (not ids or ids[0] != self.bos_token_id):
            ids.insert(0, self.bos_token_id)
        return ids


# ---- helpers for HF directories -----------------------------------------------------------------
def _read_json(path: str) -> dict[str, Any]:
    if not os.path.isfile(path):
        return {}
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    return data if isinstance(data, dict) else {}


def _token_content(v: Any) -> str | None:
    if isinstance(v, dict):  # serialized AddedToken
        return v.get("content")
    return v if isinstance(v, str) else None


def _opt_int(v: Any) -> int | None:
    return None if v is None else int(v)


def _id_list(v: Any) -> list[int]:
    if v is None:
        return []
    return [int(x) for x in v] if isinstance(v, list) else [int(v)]


def _first_id(v: Any) -> int | None:
    ids = _id_list(v)
    return ids[0] if ids else None


def _post_processor_adds(backend: Backend, bos: int | None, eos: int | None) -> tuple[bool, bool]:
    """Whether tokenizer.json's post-processor adds BOS / EOS (what HF's encode would do)."""
    plain = backend.encode("a", add_special_tokens=False).ids
    full = backend.encode("a", add_special_tokens=True).ids
    adds_bos = bos is not None and bool(full) and full[0] == bos and (not plain or plain[0] != bos)
    adds_eos = eos is not None and bool(full) and full[-1] == eos and (not plain or plain[-1] != eos)
    return adds_bos, adds_eos


def _hf_chat_template(path: str, cfg: dict[str, Any]) -> str | None:
    t = cfg.get("chat_template")
    if isinstance(t, list):  # named templates: [{"name": "default", "template": ...}, ...]
        named = {d.get("name"): d.get("template") for d in t if isinstance(d, dict)}
        t = named.get("default") or next(iter(named.values()), None)
    if isinstance(t, str) and t:
        return t
    jinja_path = os.path.join(path, "chat_template.jinja")
    if os.path.isfile(jinja_path):
        with open(jinja_path, encoding="utf-8") as f:
            return f.read()
    t = _read_json(os.path.join(path, "chat_template.json")).get("chat_template")
    return t if isinstance(t, str) and t else None


def _detect_kind(backend: Backend) -> VocabKind:
    dec = json.loads(backend.to_str()).get("decoder") or {}
    text = json.dumps(dec)
    if '"ByteLevel"' in text:
        return "byte_level"
    if '"ByteFallback"' in text:
        return "byte_fallback"
    return "raw"
