"""The accept walk: greedy identity and distribution preservation (pure, no model)."""

import torch

from augury.engine.sampler import make_generator
from augury.spec.ngram import lookup
from augury.spec.verify import verify_greedy, verify_sampling

import numpy as np


def test_greedy_accepts_matching_prefix_then_corrects():
    r = verify_greedy([5, 6, 9, 1], [5, 6, 7])
    assert r.num_accepted == 2 and r.tokens == [5, 6, 9]
    r = verify_greedy([5, 6, 7, 1], [5, 6, 7])
    assert r.num_accepted == 3 and r.tokens == [5, 6, 7, 1]
    r = verify_greedy([4], [])
    assert r.num_accepted == 0 and r.tokens == [4]


def _chi2_ok(counts: torch.Tensor, probs: torch.Tensor, n: int) -> bool:
    exp = probs * n
    keep = exp > 5
    stat = float((((counts - exp) ** 2) / exp)[keep].sum())
    dof = int(keep.sum()) - 1
    # Wilson-Hilferty 99.9% critical value
    z = 3.09
    crit = dof * (1 - 2 / (9 * dof) + z * (2 / (9 * dof)) ** 0.5) ** 3
    return stat < crit


def test_deterministic_draft_rejection_sampling_preserves_p():
    torch.manual_seed(0)
    V = 6
    p = torch.softmax(torch.randn(2, V), -1)
    g = make_generator(123)
    n = 20000
    counts = torch.zeros(V)
    for _ in range(n):
        r = verify_sampling(p.log(), [2], None, g)
        counts[r.tokens[0]] += 1
    assert _chi2_ok(counts, p[0], n)


def test_draft_probability_rejection_sampling_preserves_p():
    torch.manual_seed(1)
    V = 6
    p = torch.softmax(torch.randn(2, V), -1)
    q = torch.softmax(torch.randn(1, V), -1)
    g = make_generator(7)
    gd = make_generator(8)
    n = 20000
    counts = torch.zeros(V)
    for _ in range(n):
        d = int(torch.multinomial(q[0], 1, generator=gd))
        r = verify_sampling(p.log(), [d], q, g)
        counts[r.tokens[0]] += 1
    assert _chi2_ok(counts, p[0], n)


def test_ngram_lookup_takes_latest_longest_match():
    t = np.array([1, 2, 3, 4, 9, 1, 2, 3, 5, 6, 1, 2, 3], dtype=np.int64)
    assert lookup(t, 1, 4, 2) == [5, 6]  # "1 2 3" last seen before position 8
    assert lookup(np.array([7, 8, 9]), 1, 3, 4) == []
    assert lookup(np.array([4, 5, 4]), 1, 3, 3) == [5, 4]


def test_greedy_tokens_match_processed_logprobs_argmax():
    """The verify fast path (argmax only) picks what the one-hot processed rows pick,
    with bias and penalties applied; sampled rows are refused."""
    import pytest

    from augury.engine.sampler import SamplingRow, greedy_tokens, processed_logprobs
    from augury.engine.types import SamplingParams

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 50, generator=g)
    logits[2, 7] = logits[2, 9] = logits[2].max() + 1  # a tie: both take the first index
    plain = SamplingParams(temperature=0.0)
    shaped = SamplingParams(temperature=0.0, repetition_penalty=1.3, presence_penalty=0.5, logit_bias={3: 5.0})
    rows = [SamplingRow(params=p, prompt_ids=[1, 2, 3], output_ids=list(range(i)), generator=None)
            for i, p in enumerate([plain, shaped] * 3)]
    want = processed_logprobs(logits, rows).argmax(dim=-1)
    assert torch.equal(greedy_tokens(logits, rows), want)
    with pytest.raises(ValueError):
        greedy_tokens(logits, [SamplingRow(SamplingParams(temperature=1.0), [], [], make_generator(1))])
