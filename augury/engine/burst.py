"""Decode bursts: several greedy decode steps per engine iteration.

On a GPU the model's step is short (a 135M model: well under a millisecond in a
CUDA graph) while the engine's host work per step (schedule, metadata, sampler,
detokenizer, streaming) costs a few milliseconds, so small models and batches
are host-bound. When every running request is a plain greedy decode, the
runner computes N steps in a row with the argmax fed back on the device (one
CUDA graph holds all N forwards) and the core then emits the N tokens per
request through the normal stop / EOS / detokenizer path. A request that stops
inside the burst drops the tokens after its stop, exactly as if it had stopped
at that step, so the output is the same token for token; only the wasted
forwards of the stopped request's tail are extra.

Pipelined bursts: the host's work between two bursts (waiting for the tokens,
emitting them, scheduling, filling the next inputs) leaves the GPU idle. So while
the running set stays the burst's, the next burst is launched before the one in
flight is waited for: its first input is that burst's last argmax row, taken on the
device, and its positions run on from there (`chain_length`, EngineCore._burst).
The host then emits burst k while the GPU computes burst k+1. When a request stops
(or is aborted) in burst k, burst k+1 is dropped whole: it computed the others in a
batch that still held the stopped request, which an unchained engine would not run
(on a GPU the batch size picks the kernels). The KV it wrote lies past every
request's confirmed tokens: never published, trimmed or released after, and any
reuse of it is ordered after burst k+1 on the stream. Chaining is on by default on
CUDA only (elsewhere launches are synchronous); `AUGURY_BURST_PIPELINE=0` (or
EngineConfig.burst_pipeline = False) turns it off. On the H200, random Llama-3-8B
bf16 weights, eager, 1024-token prompts: B=1 202 -> 209 tok/s, B=8 1184 -> 1233 (the same tokens).

Eligible requests: greedy, no logprobs, no logit bias, no penalties, no grammar,
no speculation (those need the host sampler or a verify step each token).
"""

from __future__ import annotations

from augury.engine.request import Request
from augury.engine.scheduler import SchedulerOutput

AUTO_BURST_CUDA = 8  # steps per burst when --decode-burst is auto on a CUDA-graph engine
# Bursts pay off while the host step is the bottleneck. On the H200: 8B B=1 163 -> 174 tok/s and
# SmolLM2 B=1 392 -> 520 (eager, docs/data/roofline-h200-burst-paged.json, where 8B B=64 read
# 4578 -> 3680). Under --compile at e0167e3 an 8B B=64 step is 7.2 ms of GPU time and ~6 ms of host
# work between replays (schedule, metadata, sampling, emitting 64 tokens): bursts of 8 took B=64
# from 5043 to 6339 tok/s (docs/data/roofline-h200-compile-b64-e0167e3.json). Larger batches run
# one step at a time.
MAX_BURST_BATCH = 64


def burst_eligible(req: Request) -> bool:
    p = req.params
    return (p.greedy and not p.logprobs and p.top_logprobs == 0 and not p.logit_bias
            and p.repetition_penalty == 1.0 and p.presence_penalty == 0.0 and p.frequency_penalty == 0.0
            and req.matcher is None and req.spec_method is None)


def _room(req: Request, max_steps: int, max_model_len: int, produced: int = 0) -> int:
    """Steps a burst may take for `req` with `produced` tokens still on their way: never past
    its max_tokens or the context window."""
    return min(max_steps, req.params.max_tokens - len(req.output_ids) - produced,
               max_model_len - req.num_tokens - produced)


def burst_length(sched: SchedulerOutput, max_steps: int, max_model_len: int, queue_empty: bool) -> int:
    """How many greedy steps this step may run at once (< 2: a normal step).

    Only when nothing waits for admission (a burst would delay its prefill), nothing was
    preempted, and every scheduled request decodes one token and is eligible; never past
    any request's max_tokens or the context window, so no token is computed that a
    normal step would not compute for a request that keeps running."""
    if max_steps < 2 or not queue_empty or sched.preempted or not sched.seqs or len(sched.seqs) > MAX_BURST_BATCH:
        return 0
    n = max_steps
    for s in sched.seqs:
        req = s.request
        if s.num_new != 1 or s.num_draft or not s.sample or req.in_prefill or not burst_eligible(req):
            return 0
        n = min(n, _room(req, max_steps, max_model_len))
    return n if n >= 2 else 0


def chain_length(reqs: list[Request], running: list[Request], in_flight: int, max_steps: int,
                 max_model_len: int, queue_empty: bool) -> int:
    """How many steps the burst chained behind one still in flight (`in_flight` steps, for
    `reqs`) may take (< 2: none; engine/core.py waits for the burst and schedules as usual).

    Only while nothing waits for admission, the running set is still exactly the burst's
    (nothing joined, finished, was aborted or preempted) and every request is eligible; its
    tokens count as produced, so the pair never goes past a max_tokens or the context. A
    stop inside the burst in flight cannot be known yet: EngineCore drops the chained burst
    whole when one happens."""
    if max_steps < 2 or not queue_empty or len(running) != len(reqs):
        return 0
    ids = {id(r) for r in reqs}
    if len(ids) != len(reqs) or any(id(r) not in ids for r in running):
        return 0
    n = max_steps
    for req in reqs:
        if req.finished or req.num_computed != req.num_tokens - 1 or not burst_eligible(req):
            return 0
        n = min(n, _room(req, max_steps, max_model_len, in_flight))
    return n if n >= 2 else 0
