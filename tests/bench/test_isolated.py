"""Peers in child processes: calls, results, load failures and close go through the pipe."""

import os

import pytest

from augury.bench.peers.base import GenTiming, PeerUnavailable
from augury.bench.peers.isolated import IsolatedPeer

FAKE = "tests.bench.test_isolated:make_fake"


def make_fake(name: str, rate: float):
    from tests.bench.fakes import FakePeer

    class Reporting(FakePeer):
        def generate(self, ids, max_tokens, ignore_eos=True, method=None):
            g = super().generate(ids, max_tokens, ignore_eos, method)
            g.extras["pid"] = float(os.getpid())
            return g

    return Reporting(name, rate)


def unavailable():
    raise PeerUnavailable("needs the moon; pip install moon")


def broken():
    raise ValueError("bad file")


def test_calls_run_in_another_process_and_return_results():
    p = IsolatedPeer(FAKE, "fake", 50.0)
    try:
        assert p.name == "fake"
        g = p.generate([1, 2, 3], 11, method="ngram")
        assert isinstance(g, GenTiming)
        assert g.gen_tokens == 11 and g.prompt_tokens == 3
        assert g.extras["pid"] != os.getpid()
        assert g.decode_rate == pytest.approx(100.0)  # the fake doubles its rate for ngram
        assert p.generate_batch([[1], [2]], 4) is None  # FakePeer without batch support
    finally:
        p.close()
    assert not p._proc.is_alive()


def test_load_failures_become_skips_with_the_reason():
    with pytest.raises(PeerUnavailable, match="pip install moon"):
        IsolatedPeer("tests.bench.test_isolated:unavailable")
    with pytest.raises(PeerUnavailable, match="ValueError: bad file"):
        IsolatedPeer("tests.bench.test_isolated:broken")


def test_errors_inside_a_call_are_raised_in_the_harness():
    p = IsolatedPeer(FAKE, "fake", 50.0)
    try:
        with pytest.raises(RuntimeError, match="peer fake: TypeError"):
            p._call("generate")  # missing arguments
        assert p.generate([1], 2).gen_tokens == 2  # still serving after the error
    finally:
        p.close()
