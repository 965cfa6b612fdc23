"""Sampler tests on hand-made distributions (CPU, seconds)."""

from __future__ import annotations

import math

import pytest
import torch

from augury.engine.sampler import (
    SamplingRow,
    _inverse_cdf,
    draw_from_logprobs,
    make_generator,
    processed_logprobs,
    sample,
)
from augury.engine.sampling import processors as P
from augury.engine.types import SamplingParams

NEG_INF = float("-inf")
# chi-square critical values at p = 0.001, by degrees of freedom
CHI2_999 = {1: 10.83, 2: 13.82, 3: 16.27, 4: 18.47, 5: 20.52, 6: 22.46, 7: 24.32}


def logits_of(probs: list[float]) -> torch.Tensor:
    """[1, V] logits whose softmax is `probs` (0 -> -inf)."""
    return torch.tensor([[math.log(p) if p > 0 else NEG_INF for p in probs]])


def row(prompt=(), output=(), seed: int | None = 0, mask=None, **kw) -> SamplingRow:
    params = SamplingParams(**kw)
    gen = None if params.greedy else make_generator(seed)
    return SamplingRow(params, list(prompt), list(output), gen, mask)


def support(logp: torch.Tensor) -> set[int]:
    return set(torch.nonzero(logp > NEG_INF).flatten().tolist())


def probs1(logits: torch.Tensor, **kw) -> torch.Tensor:
    """Processed distribution of a single row as probabilities [V]."""
    return processed_logprobs(logits, [row(**kw)])[0].exp()


def chi_square(counts: torch.Tensor, probs: torch.Tensor) -> tuple[float, int]:
    """Pearson statistic over the support of probs; counts outside it are an error."""
    assert counts[probs == 0].sum() == 0, "drew a token outside the support"
    n = counts.sum()
    live = probs > 0
    expected = probs[live].double() * n
    stat = ((counts[live].double() - expected) ** 2 / expected).sum().item()
    return stat, int(live.sum()) - 1


P4 = [0.5, 0.3, 0.15, 0.05]


# ---------------------------------------------------------------- greedy


def test_greedy_is_argmax_and_ties_take_lowest_id():
    logits = torch.tensor([[0.1, 2.0, 2.0, -1.0], [5.0, 1.0, 5.0, 0.0]])
    out = sample(logits, [row(temperature=0), row(temperature=0)])
    assert out.token_ids.tolist() == [1, 0]
    assert out.token_ids.dtype == torch.long and out.token_ids.device.type == "cpu"
    assert out.logprobs is None and out.top_ids is None


def test_greedy_processed_distribution_is_one_hot_after_bias():
    logits = torch.tensor([[3.0, 1.0, 2.0]])
    logp = processed_logprobs(logits, [row(temperature=0, logit_bias={2: 1.5})])
    assert logp[0].tolist() == [NEG_INF, NEG_INF, 0.0]


def test_greedy_ignores_temperature_style_filters():
    logits = torch.tensor([[1.0, 4.0, 2.0]])
    out = sample(logits, [row(temperature=0, top_k=1, top_p=0.1, min_p=0.9)])
    assert out.token_ids.tolist() == [1]


# ---------------------------------------------------------------- temperature and filters


def test_temperature_scales_logits():
    logits = torch.tensor([[1.0, 2.0, -0.5, 0.0]])
    for t in (0.3, 1.0, 2.5):
        got = processed_logprobs(logits, [row(temperature=t)])
        torch.testing.assert_close(got, (logits / t).log_softmax(-1))


def test_top_k_support_ties_and_oversize():
    logits = torch.tensor([[3.0, 1.0, 2.0, 2.0, 0.5]])
    assert support(probs1(logits, top_k=1).log()) == {0}
    assert support(probs1(logits, top_k=2).log()) == {0, 2, 3}  # tie at the boundary kept
    assert support(probs1(logits, top_k=3).log()) == {0, 2, 3}
    assert support(probs1(logits, top_k=4).log()) == {0, 1, 2, 3}
    assert support(probs1(logits, top_k=0).log()) == set(range(5))  # off
    assert support(probs1(logits, top_k=99).log()) == set(range(5))  # k > V
    p = probs1(logits, top_k=1)
    assert p[0].item() == pytest.approx(1.0)


def test_top_k_renormalizes():
    p = probs1(logits_of(P4), top_k=2)
    torch.testing.assert_close(p, torch.tensor([0.625, 0.375, 0.0, 0.0]))


def test_top_p_support():
    logits = logits_of(P4)
    assert support(probs1(logits, top_p=0.45).log()) == {0}
    assert support(probs1(logits, top_p=0.75).log()) == {0, 1}
    assert support(probs1(logits, top_p=0.85).log()) == {0, 1, 2}
    assert support(probs1(logits, top_p=0.99).log()) == {0, 1, 2, 3}
    torch.testing.assert_close(probs1(logits, top_p=0.75), torch.tensor([0.625, 0.375, 0.0, 0.0]))


def test_top_p_one_keeps_even_the_tiniest_tail():
    probs = [0.999999] + [1e-7] * 10
    logits = logits_of(probs)
    assert support(probs1(logits, top_p=1.0).log()) == set(range(11))


def test_top_p_ties_kept():
    logits = logits_of([0.4, 0.2, 0.2, 0.2])
    assert support(probs1(logits, top_p=0.5).log()) == {0, 1, 2, 3}
    assert support(probs1(logits, top_p=0.3).log()) == {0}


@pytest.mark.parametrize("first_k", [1, 2, 5, 300])
def test_top_p_head_search_matches_full_sort(first_k):
    """The CPU path (top-k head, grown x8) must give exactly the full-sort support."""
    torch.manual_seed(7)
    x = torch.cat([torch.randn(6, 500) * s for s in (0.3, 1.0, 4.0)])
    x[0, :50] = 2.0  # a wide plateau of ties
    top_p = torch.tensor([0.1, 0.5, 0.9, 0.99, 1.0, 0.7] * 3)
    want = P.apply_top_p(x.clone(), top_p, first_k=None)
    got = P.apply_top_p(x.clone(), top_p, first_k=first_k)
    assert torch.equal(want, got)


def test_top_p_applies_after_top_k():
    # top-k=2 renormalizes to [0.625, 0.375]: top_p 0.6 then keeps only token 0
    logits = logits_of(P4)
    assert support(probs1(logits, top_p=0.6).log()) == {0, 1}
    assert support(probs1(logits, top_k=2, top_p=0.6).log()) == {0}


def test_min_p_support_and_order_after_temperature():
    logits = logits_of(P4)
    assert support(probs1(logits, min_p=0.2).log()) == {0, 1, 2}  # p >= 0.1
    assert support(probs1(logits, min_p=0.6).log()) == {0, 1}  # p >= 0.3
    assert support(probs1(logits, min_p=1.0).log()) == {0}
    # at T=2 the ratio p3/p0 becomes sqrt(0.1) ~ 0.32 > 0.2, so token 3 survives
    assert support(probs1(logits, min_p=0.2, temperature=2.0).log()) == {0, 1, 2, 3}


def test_filters_mixed_per_row_in_one_batch():
    logits = logits_of(P4).repeat(4, 1)
    rows = [row(top_k=1), row(top_p=0.75), row(min_p=0.2), row()]
    logp = processed_logprobs(logits, rows)
    assert [support(r) for r in logp] == [{0}, {0, 1}, {0, 1, 2}, {0, 1, 2, 3}]


# ---------------------------------------------------------------- penalties, bias, mask


def test_repetition_penalty_arithmetic():
    logits = torch.tensor([[2.0, -1.0, 0.5, 3.0, 0.0]])
    r = row(prompt=[0], output=[1, 1], repetition_penalty=2.0)
    want = torch.tensor([[1.0, -2.0, 0.5, 3.0, 0.0]])  # seen: 0 (prompt), 1 (output, once)
    torch.testing.assert_close(processed_logprobs(logits, [r]), want.log_softmax(-1))
    r = row(prompt=[0], output=[1], repetition_penalty=0.5)  # < 1 encourages
    want = torch.tensor([[4.0, -0.5, 0.5, 3.0, 0.0]])
    torch.testing.assert_close(processed_logprobs(logits, [r]), want.log_softmax(-1))


def test_presence_and_frequency_penalty_arithmetic():
    logits = torch.zeros(1, 5)
    r = row(prompt=[4, 4], output=[2, 2, 3], presence_penalty=0.5, frequency_penalty=0.25)
    want = torch.tensor([[0.0, 0.0, -1.0, -0.75, 0.0]])  # prompt tokens are not penalized
    torch.testing.assert_close(processed_logprobs(logits, [r]), want.log_softmax(-1))
    r = row(output=[1], presence_penalty=-1.0, frequency_penalty=-0.5)
    want = torch.tensor([[0.0, 1.5, 0.0, 0.0, 0.0]])
    torch.testing.assert_close(processed_logprobs(logits, [r]), want.log_softmax(-1))


def test_penalties_change_greedy_choice_and_only_their_row():
    logits = torch.tensor([[2.0, 1.9, 0.0], [2.0, 1.9, 0.0]])
    rows = [row(temperature=0, output=[0], frequency_penalty=0.5), row(temperature=0, output=[0])]
    assert sample(logits, rows).token_ids.tolist() == [1, 0]


def test_logit_bias_adds_and_validates():
    logits = torch.tensor([[1.0, 0.0, 0.5]])
    r = row(logit_bias={1: 2.0, 2: -0.5})
    want = torch.tensor([[1.0, 2.0, 0.0]])
    torch.testing.assert_close(processed_logprobs(logits, [r]), want.log_softmax(-1))
    assert sample(logits, [row(temperature=0, logit_bias={2: 100})]).token_ids.tolist() == [2]
    with pytest.raises(ValueError, match="logit_bias"):
        sample(logits, [row(temperature=0, logit_bias={3: 1.0})])


def test_bias_comes_before_repetition_penalty():
    # bias first makes the logit positive, so the penalty divides it: (-1 + 3) / 2 = 1
    logits = torch.tensor([[-1.0, 0.0]])
    r = row(output=[0], logit_bias={0: 3.0}, repetition_penalty=2.0)
    want = torch.tensor([[1.0, 0.0]])
    torch.testing.assert_close(processed_logprobs(logits, [r]), want.log_softmax(-1))


def test_allowed_mask_greedy_sampled_and_short_mask():
    logits = torch.tensor([[5.0, 1.0, 2.0, 0.0, 9.0]])
    mask = torch.tensor([False, True, True, False])  # shorter than V: id 4 is padding
    assert sample(logits, [row(temperature=0, mask=mask)]).token_ids.tolist() == [2]
    logp = processed_logprobs(logits, [row(mask=mask)])
    assert support(logp[0]) == {1, 2}
    rows = [row(seed=s, mask=mask) for s in range(200)]
    toks = sample(logits.repeat(200, 1), rows).token_ids
    assert set(toks.tolist()) <= {1, 2}


def test_mask_applies_only_to_its_row():
    logits = torch.tensor([[5.0, 1.0], [5.0, 1.0]])
    rows = [row(temperature=0, mask=torch.tensor([False, True])), row(temperature=0)]
    assert sample(logits, rows).token_ids.tolist() == [1, 0]


# ---------------------------------------------------------------- randomness


def test_make_generator_seeded_and_unseeded():
    a, b = make_generator(7), make_generator(7)
    assert torch.equal(torch.rand(5, generator=a), torch.rand(5, generator=b))
    c, d = make_generator(None), make_generator(None)
    assert not torch.equal(torch.rand(5, generator=c), torch.rand(5, generator=d))
    make_generator(-3)  # any int is accepted
    make_generator(2**70)


def test_sampled_row_without_generator_is_an_error():
    r = SamplingRow(SamplingParams(temperature=1.0), [], [], None)
    with pytest.raises(ValueError, match="generator"):
        sample(torch.zeros(1, 3), [r])


def _run_steps(logits_seq: list[torch.Tensor], make_rows) -> list[list[int]]:
    """Feed a fixed logits sequence; returns each row's tokens across steps."""
    rows = make_rows()
    out = [[] for _ in rows]
    for logits in logits_seq:
        toks = sample(logits[: len(rows)], rows).token_ids.tolist()
        for i, t in enumerate(toks):
            out[i].append(t)
            rows[i].output_ids.append(t)
    return out


def test_same_seed_same_tokens():
    torch.manual_seed(0)
    seq = [torch.randn(3, 50) for _ in range(20)]
    mk = lambda: [row(seed=123, top_p=0.9, presence_penalty=0.3)]  # noqa: E731
    assert _run_steps(seq, mk) == _run_steps(seq, mk)
    other = lambda: [row(seed=124, top_p=0.9, presence_penalty=0.3)]  # noqa: E731
    assert _run_steps(seq, mk) != _run_steps(seq, other)


def test_batch_composition_does_not_change_a_seeded_row():
    torch.manual_seed(1)
    v = 64
    mine = [torch.randn(1, v) for _ in range(30)]
    noise = [torch.randn(5, v) for _ in range(30)]

    def run(position: int, companions: list[dict]) -> list[int]:
        me = row(seed=42, top_k=20, temperature=0.8, output=[])
        others = [row(seed=i, **kw) for i, kw in enumerate(companions)]
        rows = others[:position] + [me] + others[position:]
        toks = []
        for step in range(30):
            batch = torch.cat([noise[step][:position], mine[step], noise[step][position:]])[: len(rows)]
            t = sample(batch, rows).token_ids.tolist()[position]
            toks.append(t)
            me.output_ids.append(t)
        return toks

    alone = run(0, [])
    assert run(0, [dict(temperature=0)]) == alone
    assert run(1, [dict(top_p=0.5), dict(temperature=0)]) == alone
    assert run(2, [dict(temperature=0), dict(min_p=0.1, logprobs=True), dict(top_logprobs=3)]) == alone


def test_randomness_consumed_once_per_sampled_row_only():
    g_ref = make_generator(5)
    torch.rand(1, generator=g_ref, dtype=torch.float64)
    r = row(seed=5)
    greedy = SamplingRow(SamplingParams(temperature=0), [], [], make_generator(9))
    sample(torch.randn(2, 10), [r, greedy])
    assert torch.equal(r.generator.get_state(), g_ref.get_state())
    assert torch.equal(greedy.generator.get_state(), make_generator(9).get_state())


def test_sample_matches_draw_from_processed_logprobs():
    torch.manual_seed(2)
    logits = torch.randn(6, 40)
    specs = [
        dict(temperature=0),
        dict(top_k=5),
        dict(top_p=0.7, temperature=0.5),
        dict(temperature=0, repetition_penalty=1.5),
        dict(min_p=0.05, frequency_penalty=0.4),
        dict(),
    ]
    mk = lambda: [row(seed=10 + i, output=[1, 2, 2], **s) for i, s in enumerate(specs)]  # noqa: E731
    rows_a, rows_b = mk(), mk()
    for _ in range(10):
        a = sample(logits, rows_a).token_ids
        b = draw_from_logprobs(processed_logprobs(logits, rows_b), [r.generator for r in rows_b])
        assert torch.equal(a, b)


def test_inverse_cdf_never_picks_zero_mass_tokens():
    logp = torch.tensor([[NEG_INF, math.log(0.5), math.log(0.5), NEG_INF, NEG_INF]] * 3)
    u = torch.tensor([0.0, 0.5, 1.0 - 2.0**-53], dtype=torch.float64)
    assert _inverse_cdf(logp, u).tolist() == [1, 2, 2]
    # u == 1 is what the largest uniform becomes once rounded to float32 (the MPS path)
    logp = torch.tensor([[math.log(0.25), math.log(0.5), NEG_INF, NEG_INF]])
    assert _inverse_cdf(logp, torch.tensor([1.0], dtype=torch.float64)).tolist() == [1]


@pytest.mark.parametrize("block", [1, 3, 7, 64, 256])
def test_inverse_cdf_blocks_match_a_flat_cdf(block):
    """Masses in 64ths and u's a third of a 3072th off any edge: every block size
    gives the token a flat float64 CDF gives."""
    torch.manual_seed(8)
    weights = torch.stack([torch.bincount(torch.randint(0, 40, (64,)), minlength=40) for _ in range(3)])
    probs = weights.double() / 64  # [3, 40], zeros included
    logp = probs.log().float()
    n = 1024
    u = (torch.arange(n, dtype=torch.float64) + 1 / 3) / n
    for r in range(3):
        want = torch.searchsorted(probs[r].cumsum(-1), u, right=True)
        got = _inverse_cdf(logp[r : r + 1].expand(n, -1), u, block=block)
        assert torch.equal(got, want)
        assert torch.all(probs[r][got] > 0)


def test_draw_accepts_unnormalized_logprobs_and_none_is_argmax():
    logp = torch.log(torch.tensor([[0.0, 2.0, 6.0], [0.1, 0.7, 0.2]]))
    gens = [make_generator(s) for s in range(4000)]
    toks = torch.stack([draw_from_logprobs(logp[:1], [g]) for g in gens[:2000]]).flatten()
    stat, df = chi_square(torch.bincount(toks, minlength=3), torch.tensor([0.0, 0.25, 0.75]))
    assert stat < CHI2_999[df]
    assert draw_from_logprobs(logp, [None, None]).tolist() == [2, 1]
    # large log-weights do not overflow
    big = torch.tensor([[1000.0, NEG_INF, 1000.0 + math.log(3.0)]])
    toks = torch.cat([draw_from_logprobs(big, [make_generator(s)]) for s in range(400)])
    assert set(toks.tolist()) == {0, 2}


# ---------------------------------------------------------------- empirical frequencies


@pytest.mark.parametrize(
    "kw",
    [
        dict(),
        dict(temperature=0.6),
        dict(temperature=1.7, top_k=5),
        dict(top_p=0.8),
        dict(min_p=0.1, temperature=1.3),
        dict(top_k=6, top_p=0.9, min_p=0.02, presence_penalty=0.8, output=[0, 0, 1]),
    ],
)
def test_frequencies_match_processed_distribution_across_seeds(kw):
    """Many rows, one per seed, in one batch: the per-seed first draws follow the law."""
    logits = torch.tensor([[2.0, 1.5, 1.0, 0.6, 0.3, 0.0, -0.5, -1.5]])
    n = 20000
    rows = [row(seed=1000 + i, **kw) for i in range(n)]
    toks = sample(logits.expand(n, -1), rows).token_ids
    probs = processed_logprobs(logits, [row(**kw)])[0].exp()
    stat, df = chi_square(torch.bincount(toks, minlength=8), probs)
    assert stat < CHI2_999[df]


def test_frequencies_match_along_one_generator_stream():
    """One request over many steps: its successive draws follow the law too."""
    logits = torch.tensor([[0.0, 1.0, 2.0, 0.5, -1.0]])
    r = row(seed=77, top_k=4)
    toks = torch.tensor([sample(logits, [r]).token_ids.item() for _ in range(4000)])
    probs = processed_logprobs(logits, [row(top_k=4)])[0].exp()
    stat, df = chi_square(torch.bincount(toks, minlength=5), probs)
    assert stat < CHI2_999[df]


def test_chi_square_has_power_against_the_wrong_distribution():
    """Guard on the tests above: drawing from the processed law must reject the raw one."""
    logits = torch.tensor([[2.0, 1.5, 1.0, 0.6, 0.3, 0.0, -0.5, -1.5]])
    n = 20000
    toks = sample(logits.expand(n, -1), [row(seed=i, temperature=0.6) for i in range(n)]).token_ids
    stat, df = chi_square(torch.bincount(toks, minlength=8), logits[0].softmax(-1))
    assert stat > 10 * CHI2_999[df]


# ---------------------------------------------------------------- logprobs


def test_processed_logprobs_normalized():
    torch.manual_seed(3)
    logits = torch.randn(5, 300)
    rows = [row(), row(top_k=7), row(top_p=0.3), row(min_p=0.2, temperature=0.4), row(temperature=0)]
    sums = processed_logprobs(logits, rows).exp().sum(-1)
    torch.testing.assert_close(sums, torch.ones(5))


def test_reported_logprobs_are_raw_and_top_is_sorted_and_consistent():
    torch.manual_seed(4)
    logits = torch.randn(3, 100) * 3
    rows = [
        row(temperature=0.3, top_k=3, repetition_penalty=1.3, output=[5], logprobs=True),
        row(temperature=0, logit_bias={7: 50.0}, top_logprobs=5),
        row(top_logprobs=2),
    ]
    out = sample(logits, rows)
    raw = logits.log_softmax(-1)
    torch.testing.assert_close(out.logprobs, raw.gather(1, out.token_ids[:, None]).squeeze(1))
    assert out.token_ids[1].item() == 7  # the bias decided the token, logprob stays raw
    assert out.top_ids.shape == (3, 5) and out.top_logprobs.shape == (3, 5)
    assert torch.all(out.top_logprobs[:, :-1] >= out.top_logprobs[:, 1:])
    torch.testing.assert_close(out.top_logprobs, raw.gather(1, out.top_ids))
    assert out.top_ids[:, 0].tolist() == logits.argmax(-1).tolist()
    assert torch.all(out.top_logprobs.exp().sum(-1) <= 1.0 + 1e-6)
    # a chosen token in the top list carries the same value in both places
    for i in range(3):
        ids = out.top_ids[i].tolist()
        if out.token_ids[i].item() in ids:
            j = ids.index(out.token_ids[i].item())
            assert out.top_logprobs[i, j].item() == pytest.approx(out.logprobs[i].item())


def test_want_logprobs_switch():
    logits = torch.randn(2, 10)
    asked = [row(logprobs=True), row(temperature=0)]
    assert sample(logits, asked, want_logprobs=False).logprobs is None
    plain = [row(), row(temperature=0)]
    assert sample(logits, plain).logprobs is None
    out = sample(logits, plain, want_logprobs=True)
    assert out.logprobs is not None and out.logprobs.shape == (2,) and out.top_ids is None


def test_large_vocab_smoke():
    v = 262144
    torch.manual_seed(5)
    logits = torch.randn(3, v) * 4
    rows = [row(top_p=0.9, seed=1), row(temperature=0), row(top_k=50, min_p=0.05, top_logprobs=20)]
    out = sample(logits, rows)
    assert out.top_ids.shape == (3, 20)
    logp = processed_logprobs(logits, [row(top_p=0.9, seed=1)])
    assert logp[0, out.token_ids[0]].item() > NEG_INF
    assert out.token_ids[1].item() == logits[1].argmax().item()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu_for_seeded_rows():
    torch.manual_seed(6)
    logits = torch.randn(4, 1000)
    mk = lambda: [row(seed=1, top_p=0.9), row(temperature=0), row(seed=2, top_k=10), row(seed=3)]  # noqa: E731
    cpu = sample(logits, mk()).token_ids
    gpu = sample(logits.cuda(), mk(), want_logprobs=True)
    assert gpu.token_ids.device.type == "cpu" and gpu.logprobs.device.type == "cpu"
    assert torch.equal(cpu, gpu.token_ids)
