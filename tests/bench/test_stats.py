import pytest

from augury.bench.stats import case_ratios, ratio, rotate, summarize


def test_summarize_median_min_max():
    s = summarize([3.0, 1.0, 10.0, 2.0, 4.0])
    assert (s.median, s.min, s.max, s.n) == (3.0, 1.0, 10.0, 5)
    assert summarize([1.0, 3.0]).median == 2.0  # even count: mean of the middle two
    assert s.as_dict()["samples"] == [3.0, 1.0, 10.0, 2.0, 4.0]


def test_summarize_rejects_empty():
    with pytest.raises(ValueError):
        summarize([])


def test_ratio_speed_and_latency():
    assert ratio(150.0, 100.0) == pytest.approx(1.5)  # augury faster
    assert ratio(50.0, 100.0) == pytest.approx(0.5)
    # latency: lower is better, so 50 ms against 100 ms is 2x better
    assert ratio(50.0, 100.0, higher_is_better=False) == pytest.approx(2.0)
    assert ratio(0.0, 100.0) is None and ratio(100.0, 0.0) is None


def test_case_ratios_excludes_subject():
    r = case_ratios({"augury": 200.0, "llama.cpp": 100.0, "hf": 20.0, "limit": 400.0}, "augury")
    assert r == pytest.approx({"llama.cpp": 2.0, "hf": 10.0, "limit": 0.5})
    assert case_ratios({"hf": 1.0}, "augury") == {}


def test_rotate_gives_every_engine_every_position():
    names = ["a", "b", "c"]
    orders = [rotate(names, r) for r in range(3)]
    assert orders == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"]]
    for pos in range(3):
        assert {o[pos] for o in orders} == set(names)
