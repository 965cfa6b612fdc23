"""Prompt-lookup drafting: continue the longest trailing k-gram seen earlier.

No model: the draft is the text that followed the most recent earlier
occurrence of the context's last k tokens (k from max_n down to min_n), over
prompt + generated tokens. Great for code edits, quoting and extraction.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from augury.engine.request import Request
from augury.spec.base import Draft


def lookup(tokens: np.ndarray, min_n: int, max_n: int, max_draft: int) -> list[int]:
    """tokens [L] int64 → draft ids (possibly empty)."""
    L = len(tokens)
    for n in range(min(max_n, L - 1), min_n - 1, -1):
        suffix = tokens[L - n:]
        windows = np.lib.stride_tricks.sliding_window_view(tokens[: L - 1], n)  # starts 0..L-1-n
        hits = np.flatnonzero((windows == suffix).all(axis=1))
        hits = hits[hits + n < L]  # must have at least one token after it (excludes the suffix itself)
        if len(hits):
            start = int(hits[-1]) + n
            return tokens[start:start + max_draft].tolist()
    return []


@dataclass
class NgramDrafter:
    min_n: int = 1
    max_n: int = 4
    name: str = "ngram"

    def propose(self, reqs: Sequence[Request], max_tokens: Sequence[int]) -> list[Draft]:
        out = []
        for req, k in zip(reqs, max_tokens):
            if k <= 0:
                out.append(Draft([]))
                continue
            toks = np.asarray(req.all_ids, dtype=np.int64)
            out.append(Draft(lookup(toks, self.min_n, self.max_n, k)))
        return out

    def on_verified(self, req: Request, num_accepted: int) -> None:
        pass

    def release(self, req: Request) -> None:
        pass
