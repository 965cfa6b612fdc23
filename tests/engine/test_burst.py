"""Decode bursts (engine/burst.py): n greedy steps per engine step give the same tokens."""

from __future__ import annotations

import pytest
import torch

from augury.engine.burst import burst_eligible
from augury.engine.engine import Engine
from augury.engine.request import Request
from augury.engine.types import SamplingParams
from tests.conftest import make_tiny_hf_model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_hf_model(tmp_path_factory.mktemp("tiny_burst"), "llama")


def _engine(path, **kw) -> Engine:
    return Engine.from_model(str(path), device="cpu", dtype="float32", progress=False, kv_budget="4MiB", **kw)


def _prompts(n):
    g = torch.Generator().manual_seed(21)
    return [torch.randint(3, 250, (5 + 6 * i,), generator=g).tolist() for i in range(n)]


@pytest.fixture(scope="module")
def engines(model_dir):
    plain, burst = _engine(model_dir, decode_burst=0), _engine(model_dir, decode_burst=5)
    yield plain, burst
    plain.shutdown()
    burst.shutdown()


def test_bursts_give_the_same_tokens(engines):
    plain, burst = engines
    ps = _prompts(6)
    params = [SamplingParams(max_tokens=7 + 4 * i, temperature=0.0, ignore_eos=True) for i in range(6)]
    want = [r.token_ids for r in plain.generate_batch(ps, params)]
    before = burst.stats()["burst_steps"]
    got = [r.token_ids for r in burst.generate_batch(ps, params)]
    assert got == want
    assert burst.stats()["burst_steps"] > before  # bursts really ran
    assert burst.wait_idle()
    burst.blocks.reset_prefix_cache()
    assert burst.blocks.num_free_blocks() == burst.blocks.num_total_blocks()


def test_a_stop_inside_a_burst_ends_at_the_same_token(engines):
    plain, burst = engines
    p = _prompts(3)[2]
    full = plain.generate(p, SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True)).token_ids
    stop = full[12]  # first seen at some index <= 12: ends the request there
    sp = SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True, stop_token_ids=[stop])
    a, b = plain.generate(p, sp), burst.generate(p, sp)
    assert a.token_ids == b.token_ids == full[: full.index(stop) + 1]
    assert a.finish_reason == b.finish_reason == "stop"
    # the next request still gets the right tokens: nothing left behind in the pool
    assert burst.generate(p, SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True)).token_ids == full


def test_joining_requests_and_sampled_ones_mix_with_bursts(engines):
    plain, burst = engines
    ps = _prompts(4)
    params = [SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True),
              SamplingParams(max_tokens=20, temperature=0.9, seed=5, ignore_eos=True),
              SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True, logprobs=True),
              SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)]
    want = [r.token_ids for r in plain.generate_batch(ps, params)]
    hs = [burst.submit(ps[0], params[0])]
    first = next(iter(hs[0])).token_ids  # running before the others join
    hs += [burst.submit(p, sp) for p, sp in zip(ps[1:], params[1:])]
    got = [Engine.collect(h).token_ids for h in hs]
    got[0] = first + got[0]
    assert got == want


def test_only_plain_greedy_requests_burst():
    assert burst_eligible(Request("a", [1], SamplingParams(temperature=0.0)))
    for sp in (SamplingParams(temperature=0.7), SamplingParams(temperature=0.0, logprobs=True),
               SamplingParams(temperature=0.0, repetition_penalty=1.1), SamplingParams(temperature=0.0, logit_bias={3: 1.0})):
        assert not burst_eligible(Request("a", [1], sp))
