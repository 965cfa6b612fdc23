"""Streaming detokenizer: token ids in, text safe to show out, with stop-string matching.

Text comes from decoding a short sliding window of ids and diffing it against the window
without the newest ids, so decoder rules that depend on neighbours (SentencePiece spaces,
byte-fallback and byte-level pieces of one character) come out exactly as a full decode.
"""

from __future__ import annotations

from typing import Any, Sequence

_REPLACEMENT = "\ufffd"  # what decoders emit for an incomplete UTF-8 sequence
_PROMPT_CONTEXT = 6  # prompt ids kept as decode context, so the first token's leading space survives
# A stream that stays undecodable this long is garbage bytes, not a character being built.
_MAX_HELD_TOKENS = 32


class StreamDetokenizer:
    """Feed generated ids one by one; `add` returns the text that is final now."""

    def __init__(
        self,
        tokenizer: Any,
        stop: Sequence[str] = (),
        skip_special_tokens: bool = True,
        prompt_ids: Sequence[int] | None = None,
    ) -> None:
        self._tok = tokenizer
        self._skip = skip_special_tokens
        self._stops = [s for s in dict.fromkeys(stop) if s]
        self._ids: list[int] = list(prompt_ids[-_PROMPT_CONTEXT:]) if prompt_ids else []
        self._prefix = 0  # window start: ids before it no longer influence new text
        self._read = len(self._ids)  # ids before it have been turned into text
        self._pending = ""  # decoded text held back because it may start a stop string
        self.text = ""  # everything emitted so far
        self.stopped = False
        self.matched_stop: str | None = None

    def _decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=self._skip)

    def _new_text(self, force: bool) -> str | None:
        """Text the ids after `_read` add, or None while it would end in a partial character."""
        if self._read == len(self._ids):
            return ""
        before = self._decode(self._ids[self._prefix:self._read])
        full = self._decode(self._ids[self._prefix:])
        held = len(self._ids) - self._read
        if not force and full.endswith(_REPLACEMENT) and held < _MAX_HELD_TOKENS:
            return None
        # diff by length: if a decoder rule rewrote earlier text, what was emitted stays emitted
        new = full[len(before):]
        self._prefix, self._read = self._read, len(self._ids)
        return new

    def _emit(self, new: str, final: bool) -> tuple[str, bool]:
        buf = self._pending + new
        self._pending = ""
        hit = self._find_stop(buf)
        if hit is not None:
            pos, stop = hit
            out = buf[:pos]
            self.stopped, self.matched_stop = True, stop
        else:
            hold = 0 if final else self._stop_prefix_len(buf)
            out, self._pending = buf[: len(buf) - hold], buf[len(buf) - hold:]
        self.text += out
        return out, self.stopped

    def _find_stop(self, buf: str) -> tuple[int, str] | None:
        best: tuple[int, str] | None = None
        for s in self._stops:
            i = buf.find(s)
            if i >= 0 and (best is None or i < best[0]):
                best = (i, s)
        return best

    def _stop_prefix_len(self, buf: str) -> int:
        """Length of the longest suffix of `buf` that begins some stop string."""
        if not self._stops:
            return 0
        longest = min(len(buf), max(len(s) for s in self._stops) - 1)
        for k in range(longest, 0, -1):
            tail = buf[-k:]
            if any(s.startswith(tail) for s in self._stops):
                return k
        return 0

    def add(self, token_id: int) -> tuple[str, bool]:
        """(text safe to emit now, stopped). After a stop, further ids are ignored."""
        if self.stopped:
            return "", True
        self._ids.append(int(token_id))
        new = self._new_text(force=False)
        if new is None or (not new and not self._pending):
            return "", False
        return self._emit(new, final=False)

    def flush(self) -> str:
        """At the end of generation (EOS, length): release everything still held back."""
        if self.stopped:
            return ""
        new = self._new_text(force=True) or ""
        out, _ = self._emit(new, final=True)
        return out
