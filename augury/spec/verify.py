"""The accept walk: which draft tokens the target keeps, and the token after them.

Pure functions over the target's *processed* distribution (the one the
sampler would draw from at each position), so a drafter can change speed
but never what is emitted:

* greedy (no generator): accept draft i while it equals the target's argmax;
  the first mismatch is replaced by the argmax — exactly plain greedy decoding.
* sampling: speculative rejection sampling. Accept draft x with probability
  min(1, p(x) / q(x)); on rejection draw from the residual max(0, p - q)
  renormalized. With a deterministic drafter (q one-hot at x) that is "accept
  with probability p(x), else resample from p with x removed". Either way every
  emitted token is distributed exactly as under plain sampling from p.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from torch import Tensor

from augury.engine.sampler import draw_from_logprobs


@dataclass
class VerifyResult:
    num_accepted: int  # draft tokens kept
    tokens: list[int]  # accepted drafts followed by one correction (or bonus) token


def verify_greedy(target_ids: Sequence[int], drafts: Sequence[int]) -> VerifyResult:
    """target_ids: the target's greedy choice at each of the k+1 verify positions."""
    a = 0
    while a < len(drafts) and drafts[a] == target_ids[a]:
        a += 1
    return VerifyResult(a, list(drafts[:a]) + [int(target_ids[a])])


def verify_sampling(logp: Tensor, drafts: Sequence[int], q: Tensor | None,
                    generator: torch.Generator) -> VerifyResult:
    """logp: [k+1, V] processed target log-probs at each verify position.
    q: [k, V] draft probabilities (None: deterministic drafts, q one-hot).
    Draws one uniform per examined draft and one token, all from `generator`."""
    k = len(drafts)
    if k:
        d = torch.tensor(drafts, dtype=torch.long, device=logp.device)
        p_d = logp[:k].gather(1, d[:, None]).squeeze(1).exp().double().cpu()
        q_d = q[:k].gather(1, d[:, None]).squeeze(1).double().cpu() if q is not None else torch.ones(k, dtype=torch.float64)
        ratio = (p_d / q_d.clamp_min(1e-30)).tolist()
    for i in range(k):
        u = torch.rand((), generator=generator, dtype=torch.float64).item()
        if u < min(1.0, ratio[i]):
            continue
        p = logp[i].exp()
        if q is None:
            res = p.clone()
            res[drafts[i]] = 0.0
        else:
            res = (p - q[i].to(p.dtype)).clamp_min(0.0)
        total = res.sum()
        if float(total) <= 0.0:  # p == q: rejection has probability 0, guard rounding
            res = p
        tok = int(draw_from_logprobs(res.log()[None], [generator])[0])
        return VerifyResult(i, list(drafts[:i]) + [tok])
    tok = int(draw_from_logprobs(logp[k:k + 1], [generator])[0])
    return VerifyResult(k, list(drafts) + [tok])
