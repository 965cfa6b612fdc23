"""Adaptive draft length: drafts stop where one more verify token costs more than it is expected to save."""

from augury.engine.request import Request
from augury.engine.types import SamplingParams
from augury.spec.calibrate import StepCostCurve
from augury.spec.coordinator import DraftPolicy


def req(alpha: float) -> Request:
    r = Request("r", [1, 2, 3], SamplingParams())
    r.spec_alpha = alpha
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
    assert r.spec_alpha < 0.7


def test_draft_length_maximizes_expected_tokens_per_step_time():
    """Brute force over n: the policy's choice has the best (1 + α + ... + α^n) / cost(1 + n)."""
    curve = StepCostCurve((1, 2, 3, 4, 5, 8, 9, 12, 16), (1.0, 1.3, 1.6, 1.9, 2.6, 3.5, 4.2, 5.1, 6.4))
    p = DraftPolicy(max_draft=10, curve=curve)
    for alpha in (0.2, 0.5, 0.7, 0.8, 0.9, 0.95):
        def rate(n):
            return sum(alpha ** i for i in range(n + 1)) / curve.cost(1 + n)
        best = max(range(11), key=lambda n: (rate(n), -n))
        assert p.length(req(alpha), 1) == best, alpha


def test_no_over_drafting_when_each_row_costs_a_third_of_a_step():
    """α = 0.8, +0.35 of a decode step per verify row: the 4th draft (0.8^4 = 0.41 > 0.35) pays
    for itself in decode-step units but lowers tokens per second (3.36/2.4 < 2.95/2.05)."""
    curve = StepCostCurve((1, 64), (1.0, 1.0 + 0.35 * 63))
    assert DraftPolicy(max_draft=10, curve=curve).length(req(0.8), 1) == 3


def test_acceptance_counts_only_the_positions_a_round_tested():
    """10 drafted, 3 accepted: positions 1-3 passed, 4 failed, 5-10 were never tested -> 3/4."""
    p = DraftPolicy(ema=1.0)
    r = req(0.5)
    p.update(r, 10, 3)
    assert abs(r.spec_alpha - 0.75) < 1e-12
    p.update(r, 4, 4)  # all accepted: 4 successes in 4 trials
    assert r.spec_alpha == 1.0
    p.update(r, 5, 0)
    assert r.spec_alpha == 0.0
    p.update(r, 0, 0)  # nothing drafted: nothing learned
    assert r.spec_alpha == 0.0


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
            return {"full": list(range(16))}

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
