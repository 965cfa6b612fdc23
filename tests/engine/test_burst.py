"""Decode bursts (engine/burst.py): n greedy steps per engine step give the same tokens, and so do
pipelined bursts (the next burst launched before the one in flight is waited for)."""

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


BURST = 5


@pytest.fixture(scope="module")
def engines(model_dir):
    """Bursts off, pipelined bursts (the default on CUDA; forced here), bursts one at a time."""
    es = (_engine(model_dir, decode_burst=0), _engine(model_dir, decode_burst=BURST, burst_pipeline=True),
          _engine(model_dir, decode_burst=BURST, burst_pipeline=False))
    yield es
    for e in es:
        e.shutdown()


def _pool_clean(e: Engine) -> bool:
    assert e.wait_idle()
    e.blocks.reset_prefix_cache()
    return e.blocks.num_free_blocks() == e.blocks.num_total_blocks()


def _first_seen_at(ids: list[int], i: int) -> int:
    """The first index >= i whose token does not occur before it (a stop id that ends there)."""
    return next(j for j in range(i, len(ids)) if ids[j] not in ids[:j])


def test_bursts_give_the_same_tokens(engines):
    plain, burst, single = engines
    ps = _prompts(6)
    # max_tokens far enough apart that bursts chain between two requests' ends
    params = [SamplingParams(max_tokens=12 + 9 * i, temperature=0.0, ignore_eos=True) for i in range(6)]
    want = [r.token_ids for r in plain.generate_batch(ps, params)]
    before = burst.stats()
    got = [r.token_ids for r in burst.generate_batch(ps, params)]
    assert got == want
    after = burst.stats()
    assert after["burst_steps"] > before["burst_steps"]  # bursts really ran
    assert after["burst_chained"] > before["burst_chained"]  # and were chained
    assert [r.token_ids for r in single.generate_batch(ps, params)] == want
    assert single.stats()["burst_chained"] == 0 and single.stats()["burst_steps"] > 0
    assert _pool_clean(burst) and _pool_clean(single)


def test_chained_bursts_run_every_step_of_a_long_request(engines):
    plain, burst, _ = engines
    p = _prompts(2)[1]
    sp = SamplingParams(max_tokens=43, temperature=0.0, ignore_eos=True)
    before = burst.stats()
    assert burst.generate(p, sp).token_ids == plain.generate(p, sp).token_ids
    after = burst.stats()
    # the first token comes from the prefill step, the other 42 from bursts of 5 (the last of 2),
    # every one after the first chained behind the one before: no forward is wasted
    assert after["burst_steps"] - before["burst_steps"] == 42
    assert after["burst_chained"] - before["burst_chained"] == 8
    assert after["steps"] - before["steps"] == 43


@pytest.mark.parametrize("at", [3, 8, 10])
def test_a_stop_while_the_next_burst_is_in_flight(engines, at):
    """A stop id inside burst k while burst k+1 is in flight: the output ends at the same token,
    k+1 was computed and dropped, and nothing of it stays behind (blocks, prefix cache)."""
    plain, burst, _ = engines
    p = _prompts(3)[1]
    full = plain.generate(p, SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True)).token_ids
    s = _first_seen_at(full, at)
    assert s <= 20  # the request would go on long enough for a burst to be chained behind
    sp = SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True, stop_token_ids=[full[s]])
    before = burst.stats()
    a, b = plain.generate(p, sp), burst.generate(p, sp)
    assert a.token_ids == b.token_ids == full[: s + 1]
    assert a.finish_reason == b.finish_reason == "stop"
    after = burst.stats()
    assert after["generation_tokens_total"] - before["generation_tokens_total"] == s + 1  # nothing past the stop
    assert after["burst_chained"] > before["burst_chained"]
    # token 0 from the prefill; bursts up to the end of the one holding token s, plus the chained one
    assert after["burst_steps"] - before["burst_steps"] == -(-s // BURST) * BURST + BURST
    # a continuation that diverges right after the stop reuses the stopped request's blocks
    # (full ones and the partial tail): only rows of emitted tokens may be in them
    cont = p + full[: s + 1] + [7, 11, 13]
    sc = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    got = burst.generate(cont, sc)
    assert got.token_ids == plain.generate(cont, sc).token_ids
    assert got.cached_tokens > len(p)
    # the next request still gets the right tokens: nothing left behind in the pool
    assert burst.generate(p, SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True)).token_ids == full
    assert _pool_clean(burst)


def test_a_stop_in_a_batch_while_a_burst_is_in_flight(engines):
    plain, burst, _ = engines
    ps = _prompts(4)
    free = SamplingParams(max_tokens=26, temperature=0.0, ignore_eos=True)
    full = plain.generate(ps[1], free).token_ids
    s = _first_seen_at(full, 7)
    params = [free, SamplingParams(max_tokens=26, temperature=0.0, ignore_eos=True, stop_token_ids=[full[s]]),
              SamplingParams(max_tokens=19, temperature=0.0, ignore_eos=True), free]
    want = [r.token_ids for r in plain.generate_batch(ps, params)]
    assert want[1] == full[: s + 1]
    before, dropped = burst.stats()["burst_chained"], burst.stats()["burst_dropped"]
    assert [r.token_ids for r in burst.generate_batch(ps, params)] == want
    assert burst.stats()["burst_chained"] > before
    # the burst chained behind the stop held the stopped request in its batch: dropped whole, so the
    # others' tokens all come from batches an unchained engine runs too
    assert burst.stats()["burst_dropped"] > dropped
    assert _pool_clean(burst)


class _Hook:
    """Runs `on_wait(run)` on the engine thread each time the core waits for a burst's tokens
    while the next burst is already in flight (ModelRunner.burst_tokens), `on_launch(reqs)` before
    each burst that follows no other is launched, and logs the engine's order of events: "launch"
    and "chain" per burst launched, "wait" per burst waited for, "prefill:<id>" when a request's
    prompt is computed."""

    def __init__(self, engine: Engine, monkeypatch, on_wait=None, on_launch=None):
        self.log: list[str] = []
        core, runner = engine.core, engine.runner
        wait, execute, launch = runner.burst_tokens, runner.execute, runner.launch_burst

        def burst_tokens(run):
            if core._in_flight is not None and on_wait is not None:
                on_wait(run)
            self.log.append("wait")
            return wait(run)

        def launch_burst(reqs, n, after=None):
            if after is None and on_launch is not None:
                on_launch(reqs)
            self.log.append("launch" if after is None else "chain")
            return launch(reqs, n, after)

        def run_step(out):
            self.log += [f"prefill:{s.request.request_id}" for s in out.seqs if s.request.in_prefill]
            return execute(out)

        monkeypatch.setattr(runner, "burst_tokens", burst_tokens)
        monkeypatch.setattr(runner, "launch_burst", launch_burst)
        monkeypatch.setattr(runner, "execute", run_step)


@pytest.mark.parametrize("when", ["in_flight", "before_chaining"])
def test_a_request_submitted_during_a_chain(engines, monkeypatch, when):
    """It is admitted no later than right after the burst in flight when it arrived, and its
    tokens (and the running request's) are those it gets alone. Arriving while a burst is being
    launched, before the next one is chained, it stops the chaining at once."""
    plain, burst, _ = engines
    ps = _prompts(5)
    sa = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    sb = SamplingParams(max_tokens=23, temperature=0.0, ignore_eos=True)
    late = []
    at = 10 if when == "in_flight" else 1  # before_chaining: the first burst, right after the prefill

    def arrive(reqs):
        if not late and len(reqs[0].output_ids) >= at:
            late.append(burst.submit(ps[4], sb, request_id="late"))
            hook.log.append("submit")

    if when == "in_flight":
        hook = _Hook(burst, monkeypatch, on_wait=lambda run: arrive(run.reqs))
    else:
        hook = _Hook(burst, monkeypatch, on_launch=arrive)
    first = burst.submit(ps[3], sa)
    got_a = Engine.collect(first).token_ids
    assert late, "the first request never reached the point"
    got_b = Engine.collect(late[0]).token_ids
    assert got_a == plain.generate(ps[3], sa).token_ids
    assert got_b == plain.generate(ps[4], sb).token_ids
    assert "chain" in hook.log
    i = hook.log.index("submit")
    if when == "in_flight":
        # this burst's tokens, then the one chained behind it (no further chaining), then its prefill
        assert hook.log[i + 1:i + 4] == ["wait", "wait", "prefill:late"]
    else:  # no burst chained behind the one being launched
        assert hook.log[i + 1:i + 4] == ["launch", "wait", "prefill:late"]
    assert _pool_clean(burst)


def test_an_abort_during_a_chain(engines, monkeypatch):
    """The aborted request's tokens from the burst in flight are dropped; the other request
    keeps going with the tokens it gets alone; every block comes back."""
    plain, burst, _ = engines
    ps = _prompts(3)
    sa = SamplingParams(max_tokens=35, temperature=0.0, ignore_eos=True)
    sb = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    want_a, want_b = (r.token_ids for r in plain.generate_batch(ps[1:], [sa, sb]))
    seen = []

    def cancel(run):
        b = next((r for r in run.reqs if r.request_id == "b"), None)
        if not seen and b is not None and len(run.reqs) == 2 and len(b.output_ids) >= 8:
            seen.append(len(b.output_ids) + run.n)  # this burst's tokens still go out
            burst.abort("b")

    _Hook(burst, monkeypatch, on_wait=cancel)
    before = burst.stats()
    ha, hb = burst.submit(ps[1], sa, request_id="a"), burst.submit(ps[2], sb, request_id="b")
    a, b = Engine.collect(ha), Engine.collect(hb)
    assert seen
    assert a.token_ids == want_a and a.finish_reason == "length"
    assert b.finish_reason == "abort" and b.token_ids == want_b[:seen[0]]
    after = burst.stats()
    assert after["generation_tokens_total"] - before["generation_tokens_total"] == len(a.token_ids) + seen[0]
    assert after["requests_finished"] - before["requests_finished"] == 2
    assert _pool_clean(burst)


def test_prefix_cache_after_chained_bursts(engines):
    """Blocks that chained bursts filled are published with the right KV: an identical request and a
    continuation of the first one's output hit them and get the tokens computed without a cache."""
    plain, burst, _ = engines
    g = torch.Generator().manual_seed(99)
    p = torch.randint(3, 250, (37,), generator=g).tolist()
    sp = SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True)
    want = plain.generate(p, sp).token_ids
    before = burst.stats()["burst_chained"]
    first = burst.generate(p, sp)
    assert first.token_ids == want and burst.stats()["burst_chained"] > before
    again = burst.generate(p, sp)
    assert again.token_ids == want
    bs = burst.blocks.block_size
    assert (len(p) - 1) // bs * bs <= again.cached_tokens <= len(p) - 1
    cont = p + want[:25] + [5]
    sc = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)
    got = burst.generate(cont, sc)
    assert got.token_ids == plain.generate(cont, sc).token_ids
    assert (len(cont) - 1) // bs * bs <= got.cached_tokens <= len(cont) - 1
    assert _pool_clean(burst)


def test_the_environment_turns_chaining_off(model_dir, monkeypatch):
    monkeypatch.setenv("AUGURY_BURST_PIPELINE", "0")
    e = _engine(model_dir, decode_burst=BURST, burst_pipeline=True)
    try:
        assert not e.core.burst_pipeline
        e.generate(_prompts(1)[0], SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True))
        assert e.stats()["burst_chained"] == 0 and e.stats()["burst_steps"] > 0
    finally:
        e.shutdown()


def test_a_stop_inside_a_burst_ends_at_the_same_token(engines):
    plain, burst, _ = engines
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
    plain, burst, _ = engines
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


def test_a_chained_graph_call_takes_its_first_ids_on_the_device():
    """CudaGraphDecoder._call with the first ids as a device tensor (a chained burst) fills the
    graph's input exactly as with host ids: padding rows keep id 0 and the trash block (CPU stub)."""
    import numpy as np

    from tests.engine.test_cuda_graph_inputs import _decoder, _specs

    specs = _specs(np.random.default_rng(5), 3, 4)
    ids = [11, 22, 33]
    host, dev = _decoder()._call(ids, specs, 4), _decoder()._call(None, specs, 4, first_ids=torch.tensor(ids))
    assert dev.dev.shape[0] > 0 and torch.equal(host.dev, dev.dev)
    off, _ = dev.layout["ids"]
    assert dev.dev[off:off + 4].tolist() == ids + [0]
