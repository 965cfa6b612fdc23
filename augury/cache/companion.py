"""Companion state: a speculative drafter's own KV cached with the target's prefixes.

A drafter with its own paged pool (the draft-model and layerskip drafters:
`blocks`, `pool`, `computed`) gets its own PrefixCache under the namespace
`<target namespace>/draft:<draft fingerprint>` over the same SSD store. On a
target hit the drafter's first round admits the same prompt in its own block
manager, finds (or restores) its blocks there and starts drafting after a
catch-up of only the uncached tail, instead of prefilling the whole prompt.
"""

from __future__ import annotations

import hashlib
from typing import Any, Sequence

import torch

from augury.engine.request import Request
from augury.spec.base import Draft


def model_fingerprint(model: torch.nn.Module, cfg: Any) -> str:
    """Identity of a drafter's weights: config plus names, shapes, dtypes and a
    sample of each tensor's values (cheap; enough to tell checkpoints apart)."""
    h = hashlib.sha256(repr(cfg).encode())
    for name, t in sorted(model.state_dict().items()):
        h.update(f"{name}:{tuple(t.shape)}:{t.dtype}".encode())
        flat = t.detach().reshape(-1)
        if flat.numel():
            sample = torch.cat((flat[:32], flat[-32:])).cpu().contiguous()
            h.update(sample.view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


class CompanionDrafter:
    """DraftSource wrapper: admits each request in the drafter's block manager with its
    namespace (prefix hit → fewer tokens to catch up) and publishes its confirmed blocks."""

    def __init__(self, inner: Any, namespace: str):
        self.inner = inner
        self.name = inner.name
        self.namespace = namespace
        inner.blocks.enable_prefix_caching = True

    def __getattr__(self, item: str) -> Any:  # blocks, pool, computed, ... of the drafter
        return getattr(self.inner, item)

    def propose(self, reqs: Sequence[Request], max_tokens: Sequence[int]) -> list[Draft]:
        d = self.inner
        for req, k in zip(reqs, max_tokens):
            rid = req.request_id
            if k > 0 and rid not in d.computed:
                got = d.blocks.admit(rid, req.all_ids, 1 << 30, self.namespace)
                if got is not None:
                    d.computed[rid] = got[0]
        return d.propose(reqs, max_tokens)

    def on_verified(self, req: Request, num_accepted: int) -> None:
        d = self.inner
        d.on_verified(req, num_accepted)
        rid = req.request_id
        if rid in d.computed and d.blocks.has(rid):
            # the draft KV below `computed` was made from confirmed tokens: final, shareable
            d.blocks.commit(rid, req.all_ids, d.computed[rid], self.namespace)

    def release(self, req: Request) -> None:
        self.inner.release(req)
