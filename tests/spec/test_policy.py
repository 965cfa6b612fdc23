"""Adaptive draft length: drafts stop where one more verify token costs more than it is expected to save."""

from augury.engine.request import Request
from augury.engine.types import SamplingParams
from augury.spec.calibrate import StepCostCurve
from augury.spec.coordinator import DraftPolicy


def req(alpha: float, first: float | None = None) -> Request:
    """alpha: later-draft acceptance; first: the first draft's (default: the same, i.e. geometric)."""
    r = Request("r", [1, 2, 3], SamplingParams())
    r.spec_alpha = alpha
    r.spec_alpha_first = alpha if first is None else first
    return r


def test_curve_interpolates_and_extrapolates():
    c = StepCostCurve((1, 2, 4, 8), (1.0, 1.0, 1.2, 2.0))
    assert c.cost(3) == 1.1 and c.cost(16) == 2.0 + 0.2 * 8
    assert abs(c.marginal(2, 1) - 0.1) < 1e-12  # (1.1 - 1.0) / 1.0


def test_flat_curve_drafts_to_the_cap_and_steep_curve_stops_early():
    flat = DraftPolicy(max_draft=8, curve=StepCostCurve((1, 64), (1.0, 1.01)))
    steep = DraftPolicy(max_draft=8, curve=StepCostCurve((1, 2, 3, 64), (1.0, 1.6, 2.5, 100.0)))
    assert flat.length(req(0.8), 1) == 8
    assert steep.length(req(0.8), 1) == 1  # the first draft pays (0.8 > 0.6), the second does not
    assert steep.length(req(0.5), 1) == 0


def test_low_acceptance_drafts_less_and_batch_size_matters():
    curve = StepCostCurve((1, 4, 16, 64), (1.0, 1.05, 1.3, 3.0))
    p = DraftPolicy(max_draft=8, curve=curve)
    assert p.length(req(0.9), 1) > p.length(req(0.3), 1)
    assert p.length(req(0.9), 1) >= p.length(req(0.9), 16)


def test_acceptance_ema_and_fixed_mode():
    p = DraftPolicy(max_draft=6, adaptive=False)
    r = req(0.7)
    assert p.length(r, 32) == 6
    p.update(r, 4, 0)
    assert r.spec_alpha_first < 0.7 and r.spec_alpha == 0.7  # only the first position was tested


def test_draft_length_maximizes_expected_tokens_per_step_time():
    """Brute force over n: the policy's choice has the best (1 + α₀(1 + α + ... + α^(n-1))) / cost(1 + n)."""
    curve = StepCostCurve((1, 2, 3, 4, 5, 8, 9, 12, 16), (1.0, 1.3, 1.6, 1.9, 2.6, 3.5, 4.2, 5.1, 6.4))
    p = DraftPolicy(max_draft=10, curve=curve)
    for first in (None, 0.3, 0.6):
        for alpha in (0.2, 0.5, 0.7, 0.8, 0.9, 0.95):
            a0 = alpha if first is None else first

            def rate(n):
                return (1 + a0 * sum(alpha ** i for i in range(n))) / curve.cost(1 + n)
            best = max(range(11), key=lambda n: (rate(n), -n))
            assert p.length(req(alpha, first), 1) == best, (first, alpha)


def test_no_over_drafting_when_each_row_costs_a_third_of_a_step():
    """α = 0.8, +0.35 of a decode step per verify row: the 4th draft (0.8^4 = 0.41 > 0.35) pays
    for itself in decode-step units but lowers tokens per second (3.36/2.4 < 2.95/2.05)."""
    curve = StepCostCurve((1, 64), (1.0, 1.0 + 0.35 * 63))
    assert DraftPolicy(max_draft=10, curve=curve).length(req(0.8), 1) == 3


def test_acceptance_counts_only_the_positions_a_round_tested():
    """10 drafted, 3 accepted: position 1 passed (α₀), positions 2-3 passed and 4 failed (α: 2/3),
    5-10 were never tested."""
    p = DraftPolicy(ema=1.0)
    r = req(0.5)
    p.update(r, 10, 3)
    assert r.spec_alpha_first == 1.0 and abs(r.spec_alpha - 2 / 3) < 1e-12
    p.update(r, 4, 4)  # all accepted: later positions 3 successes in 3 trials
    assert r.spec_alpha_first == 1.0 and r.spec_alpha == 1.0
    p.update(r, 5, 0)  # the first draft failed: later positions untested
    assert r.spec_alpha_first == 0.0 and r.spec_alpha == 1.0
    p.update(r, 1, 1)  # one draft, accepted: no later position tested
    assert r.spec_alpha_first == 1.0 and r.spec_alpha == 1.0
    p.update(r, 0, 0)  # nothing drafted: nothing learned
    assert r.spec_alpha_first == 1.0 and r.spec_alpha == 1.0


def test_bursty_acceptance_drafts_on_after_a_miss():
    """Prompt lookup misses at the first token often but, once right, stays right: with α₀ = 0.3
    and α = 0.9 a run of drafts pays; one geometric rate of 0.3 would stop at two."""
    curve = StepCostCurve((1, 2, 3, 4, 5, 8, 9, 12, 16), (1.0, 1.05, 1.1, 1.15, 1.6, 1.75, 2.2, 2.4, 3.0))
    p = DraftPolicy(max_draft=10, curve=curve)
    assert p.length(req(0.3), 1) == 2
    assert p.length(req(0.9, first=0.3), 1) == 3


def test_a_request_that_stopped_drafting_probes_again():
    """α₀ near 0 after misses: the policy drafts nothing, and steps without drafts move α₀ back
    toward the prior, so the request probes again instead of never learning more."""
    from augury.spec.coordinator import SpecCoordinator

    curve = StepCostCurve((1, 2, 3, 4, 64), (1.0, 1.08, 1.16, 1.25, 10.0))
    p = DraftPolicy(max_draft=4, curve=curve)
    r = req(0.9, first=0.0)
    r.spec_method = "ngram"
    r.num_computed = r.num_tokens - 1  # decoding
    assert p.length(r, 1) == 0
    coord = SpecCoordinator({"ngram": None}, p)
    steps = 0
    while p.length(r, 1) == 0:
        coord.propose([r], max_model_len=1000)  # nothing drafted -> rest()
        steps += 1
        assert steps < 5
    assert 0.0 < r.spec_alpha_first < p.prior
    fixed = DraftPolicy(max_draft=4, adaptive=False)
    r2 = req(0.9, first=0.0)
    fixed.rest(r2)
    assert r2.spec_alpha_first == 0.0  # fixed mode keeps no state to recover


def test_calibration_ignores_a_load_spike(monkeypatch):
    """A fake clock: each forward of T tokens costs 1 + T/10; one forward (T = 8, first measured
    round) is hit by a 100x spike. The curve keeps the true costs, round-robin + fastest."""
    from types import SimpleNamespace

    import torch

    import augury.spec.calibrate as cal

    clock = [0.0]
    calls = {}

    class FakeBlocks:
        block_size = 16

        def admit(self, *a, **k):
            return True

        def block_tables(self, _):
            return {"full": list(range((cal.CONTEXT + cal.SIZES[-1]) // 16 + 1))}

        def free(self, _):
            pass

    class FakeModel:
        def __call__(self, ids, positions, meta, pool):
            T = ids.shape[0]
            calls[T] = calls.get(T, 0) + 1
            clock[0] += (1 + T / 10) * (100 if T == 8 and calls[T] == 2 else 1)
            return torch.zeros(T, 4)

        def compute_logits(self, h):
            return h

    monkeypatch.setattr(cal, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
    curve = cal.measure_step_costs(FakeModel(), object(), FakeBlocks(), {"full": None}, torch.device("cpu"))
    assert curve.sizes == cal.SIZES
    for T, t in zip(curve.sizes, curve.seconds):
        assert abs(t - (1 + T / 10)) < 1e-9, (T, t)


def test_calibration_stays_inside_a_short_context_window():
    """An engine whose window is shorter than the default calibration context plus the largest
    size measures fewer sizes after a shorter context; no position reaches the window (the rope
    table of a 256-token engine ended at 255 and the start-up calibration indexed past it)."""
    import torch

    import augury.spec.calibrate as cal

    seen = []

    class FakeBlocks:
        block_size = 16

        def admit(self, *a, **k):
            return True

        def block_tables(self, _):
            return {"full": list(range(64))}

        def free(self, _):
            pass

    class FakeModel:
        def __call__(self, ids, positions, meta, pool):
            seen.append(int(positions.max()))
            return torch.zeros(ids.shape[0], 4)

        def compute_logits(self, h):
            return h

    curve = cal.measure_step_costs(FakeModel(), object(), FakeBlocks(), {"full": None}, torch.device("cpu"),
                                   max_len=100)
    assert curve.sizes == tuple(T for T in cal.SIZES if T < 100) and curve.sizes[-1] == 64
    assert max(seen) == 99  # context 36 + 64 tokens: the last position is the window's last
    assert cal.measure_step_costs(FakeModel(), object(), FakeBlocks(), {"full": None}, torch.device("cpu"),
                                  max_len=2) is None  # one size: nothing to interpolate
