"""layers/attention_cpu_op.py: under torch.compile, CPU attention is the eager computation.

Speculation on a compiled CPU engine is exact only if a verify-window row gets the bits its own
one-token decode step gets, and both come from the same eager code; traced attention (SDPA in
the graph) would give other bits. Compiled here with backend="eager" (dynamo's tracing and the
op dispatch are what is under test, not inductor's code generation)."""

from __future__ import annotations

import pytest
import torch

from augury.layers.attention import SeqSpec, build_attention_metadata, paged_attention

H, HKV, D, BS = 6, 2, 16, 16


def _case(specs, seed=0):
    g = torch.Generator().manual_seed(seed)
    meta = build_attention_metadata(specs, BS, {"full": None}, "cpu")
    T = meta.num_tokens
    pools = (torch.randn(32 * BS, HKV, D, generator=g), torch.randn(32 * BS, HKV, D, generator=g))
    q, k, v = (torch.randn(T, n, D, generator=g) for n in (H, HKV, HKV))
    return q, k, v, pools, meta.groups["full"]


def _run(fn, q, k, v, pools, gm):
    kp, vp = pools[0].clone(), pools[1].clone()
    return fn(q, k, v, kp, vp, gm, 0.25, None)


@pytest.mark.parametrize("specs", [
    [SeqSpec(37, 1, {"full": list(range(4))})],  # a lone decode step
    [SeqSpec(37, 5, {"full": list(range(4))})],  # a verify window of 1 + 4 drafts
    [SeqSpec(20, 1, {"full": list(range(4))}), SeqSpec(9, 4, {"full": list(range(4, 8))})],  # decode + window
    [SeqSpec(0, 40, {"full": list(range(4))})],  # a prefill chunk (SDPA, inside the op)
], ids=["decode", "window", "mixed", "prefill"])
def test_compiled_cpu_attention_is_bitwise_the_eager_path(specs):
    q, k, v, pools, gm = _case(specs)
    torch._dynamo.reset()
    compiled = torch.compile(paged_attention, dynamic=True, backend="eager", fullgraph=True)
    with torch.inference_mode():
        want = _run(paged_attention, q, k, v, pools, gm)
        got = _run(compiled, q, k, v, pools, gm)
    assert torch.equal(got, want)


def test_window_rows_equal_their_lone_decode_steps_when_compiled():
    """The property speculation needs, end to end through the compiled op: row j of a window equals
    a one-token step at that position (same pools, the window's earlier tokens already written)."""
    g = torch.Generator().manual_seed(3)
    tables = {"full": list(range(4))}
    ctx, n = 30, 4
    kp, vp = torch.randn(32 * BS, HKV, D, generator=g), torch.randn(32 * BS, HKV, D, generator=g)
    q, k, v = (torch.randn(n, m, D, generator=g) for m in (H, HKV, HKV))
    torch._dynamo.reset()
    compiled = torch.compile(paged_attention, dynamic=True, backend="eager", fullgraph=True)
    with torch.inference_mode():
        gm = build_attention_metadata([SeqSpec(ctx, n, tables)], BS, {"full": None}, "cpu").groups["full"]
        window = compiled(q, k, v, kp.clone(), vp.clone(), gm, 0.25, None)
        for j in range(n):
            kj, vj = kp.clone(), vp.clone()
            kj[ctx:ctx + j], vj[ctx:ctx + j] = k[:j], v[:j]  # the earlier window tokens, as cached
            one = build_attention_metadata([SeqSpec(ctx + j, 1, tables)], BS, {"full": None}, "cpu").groups["full"]
            lone = compiled(q[j:j + 1], k[j:j + 1], v[j:j + 1], kj, vj, one, 0.25, None)
            assert torch.equal(window[j], lone[0]), j
