"""Per-request grammar matchers on xgrammar.

The engine builds one matcher per constrained request at submit
(`make_matcher`) and then, per step: `fill_mask()` for the sampler,
`accept(token)` for the emitted token, `is_terminated()` to finish. Speculative
decoding masks draft positions on a `fork()` and undoes with `rollback(n)`.
"""

from __future__ import annotations

import json
from typing import Any

import torch

from augury.structured.vocab import vocab_info

_INSTALL_HINT = (
    "structured output needs the 'xgrammar' package: pip install xgrammar"
)


def _xgr():
    try:
        import xgrammar  # noqa: PLC0415 - optional dependency
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise RuntimeError(_INSTALL_HINT) from e
    return xgrammar


class GrammarBackend:
    """One compiler per (tokenizer, logits width): compiling the vocabulary is the slow part."""

    def __init__(self, tokenizer: Any, vocab_size: int | None = None) -> None:
        xgr = _xgr()
        info = vocab_info(tokenizer)
        width = max(int(vocab_size or 0), len(info.tokens))
        kinds = {
            "raw": xgr.VocabType.RAW,
            "byte_fallback": xgr.VocabType.BYTE_FALLBACK,
            "byte_level": xgr.VocabType.BYTE_LEVEL,
        }
        self.vocab_size = width
        self.stop_token_ids = info.stop_token_ids
        self.tokenizer_info = xgr.TokenizerInfo(
            info.tokens,
            kinds[info.kind],
            vocab_size=width,
            stop_token_ids=info.stop_token_ids or None,
        )
        self.compiler = xgr.GrammarCompiler(self.tokenizer_info, max_threads=2)

    def compile(self, spec: dict) -> Any:
        """spec -> xgrammar CompiledGrammar; ValueError naming the field on bad input."""
        if not isinstance(spec, dict) or "type" not in spec:
            raise ValueError("response_format: expected an object with a 'type'")
        kind = spec["type"]
        try:
            if kind == "json_object":
                return self.compiler.compile_builtin_json_grammar()
            if kind == "json_schema":
                schema = spec.get("schema")
                if schema is None:
                    raise ValueError("response_format.json_schema.schema: required")
                if isinstance(schema, dict):
                    schema = json.dumps(schema)
                return self.compiler.compile_json_schema(
                    schema,
                    strict_mode=bool(spec.get("strict", True)),
                    # compact JSON keeps small models from wandering into whitespace
                    any_whitespace=bool(spec.get("any_whitespace", True)),
                )
            if kind == "regex":
                return self.compiler.compile_regex(spec["pattern"])
            if kind == "ebnf":
                return self.compiler.compile_grammar(spec["grammar"])
        except ValueError:
            raise
        except Exception as e:  # xgrammar raises RuntimeError/its own types on bad grammars
            raise ValueError(f"response_format: invalid {kind}: {e}") from e
        raise ValueError(f"response_format.type: unsupported {kind!r}")


def backend_for(tokenizer: Any, vocab_size: int | None = None) -> GrammarBackend:
    """The tokenizer's backend, built once and kept on the tokenizer object itself
    (an engine keeps one tokenizer for its lifetime; no module-level cache)."""
    cache = getattr(tokenizer, "_augury_grammar_backends", None)
    if cache is None:
        cache = {}
        try:
            tokenizer._augury_grammar_backends = cache
        except AttributeError:  # slotted/frozen tokenizer: rebuild each time
            pass
    if vocab_size not in cache:
        cache[vocab_size] = GrammarBackend(tokenizer, vocab_size)
    return cache[vocab_size]


class GrammarMatcher:
    """The engine-facing matcher: bool masks over the model's logits width."""

    def __init__(self, inner: Any, vocab_size: int, stop_token_ids: list[int]) -> None:
        xgr = _xgr()
        self._m = inner
        self.vocab_size = vocab_size
        self.stop_token_ids = stop_token_ids
        self._bitmask = xgr.allocate_token_bitmask(1, vocab_size)  # int32 [1, ceil(V/32)]
        self._shifts = torch.arange(32, dtype=torch.int32)

    def fill_bitmask(self, bitmask: torch.Tensor, index: int = 0) -> None:
        """Fill row `index` of a batched int32 bitmask [B, ceil(V/32)] (xgrammar layout)."""
        self._m.fill_next_token_bitmask(bitmask, index)

    def fill_mask(self) -> torch.Tensor:
        """-> bool [vocab_size]; True = the token may come next."""
        self._m.fill_next_token_bitmask(self._bitmask, 0)
        bits = (self._bitmask[0].unsqueeze(-1) >> self._shifts) & 1  # [W, 32]
        return bits.reshape(-1)[: self.vocab_size].bool()

    def accept(self, token_id: int) -> bool:
        return bool(self._m.accept_token(int(token_id)))

    def accept_string(self, text: str) -> bool:
        return bool(self._m.accept_string(text))

    def is_terminated(self) -> bool:
        return bool(self._m.is_terminated())

    def is_completed(self) -> bool:
        return bool(self._m.is_completed())

    def rollback(self, n: int) -> None:
        if n > 0:
            self._m.rollback(int(n))

    def fork(self) -> "GrammarMatcher":
        return GrammarMatcher(self._m.fork(), self.vocab_size, self.stop_token_ids)

    def jump_forward_string(self) -> str:
        """Text the grammar forces next (may be ''); the caller tokenizes and accepts it."""
        return str(self._m.find_jump_forward_string())


def make_matcher(spec: dict, tokenizer: Any, vocab_size: int | None = None) -> GrammarMatcher:
    """Compile `spec` for `tokenizer`; ValueError (-> 400) on a bad schema/grammar."""
    xgr = _xgr()
    backend = backend_for(tokenizer, vocab_size)
    compiled = backend.compile(spec)
    inner = xgr.GrammarMatcher(compiled, max_rollback_tokens=-1)
    return GrammarMatcher(inner, backend.vocab_size, backend.stop_token_ids)
