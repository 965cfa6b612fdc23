"""CPU attention under torch.compile: each segment is one opaque custom op running the eager path.

Why an op and not traced code: the eager CPU path (layers/attention.py `_attend_segment`) picks
per step between a one-row decode, row-by-row verify windows (bitwise equal to a lone decode, so
speculation cannot change a greedy token) and SDPA for prefill chunks. Traced, that choice
specializes the graph on Python ints (rows, requests, window width: a recompile per verify width
until dynamo's limit, then eager) and inductor's fused attention gives other bits for a window
row than for the same row decoded alone. As `augury::cpu_attention_segment` the graph keeps one
node per layer whose shapes are all dynamic, and compiled attention computes exactly what eager
attention computes; inductor still fuses everything around it (norms, rope, residuals, MLP).

The graph gathers each segment's K/V (a fused copy) and the op reads rows from that buffer: the
few-query path then copies once more (each row's keys newest first), and still a SmolLM2 int4 step
measured 7.2 ms against 7.5 ms with the pools passed in (interleaved A/B, 4 runs). `augury bench
decode --compile`: 123-126 tok/s against eager 110; the op costs ~70 us per layer.

With the native kernel loaded (augury/cpu_kernels/attention.cpp) the graph calls
`augury::cpu_attention_paged` instead, which takes the pools and the gather slots themselves: the
kernel reads each row's keys in place, so there is no gathered copy at all. It runs exactly what
eager steps run (layers/attention.py `attend_native_cpu`, one segment at a time), so compiled and
eager rows, and window rows and lone decode rows, keep the same bits.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

import torch

from augury.cpu_kernels import attention as native_attn
from augury.layers.attention import MAX_ROWS_WINDOW, GroupAttnMeta, _attend_segment, native_cpu_attention

_OP = "augury::cpu_attention_segment"


@torch.library.custom_op(_OP, mutates_args=())
def cpu_attention_segment(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                          q_index: torch.Tensor | None, out_index: torch.Tensor | None,
                          dense: bool, window: int, scale: float) -> torch.Tensor:
    """q [T, H, D]; k, v [B * max_kv, Hkv, D]: each request's gathered keys and values (the graph
    gathers them from the pool: a fused copy there beats index_select in here, same values);
    mask [B, 1, max_q, max_kv] bool; window -1 for full attention -> [T, H, D]."""
    B, _, max_q, max_kv = mask.shape
    flat = torch.arange(B * max_kv)  # k and v are gathered already: request b's key j is row b * max_kv + j
    gm = GroupAttnMeta(window=None if window < 0 else window, slot_mapping=flat[:0],
                       gather_slots=flat.view(B, max_kv), mask=mask, num_seqs=B, max_q=max_q, max_kv=max_kv,
                       q_index=q_index, out_index=out_index, dense=dense)
    global _last_plan
    if _last_plan is not None and _last_plan[0]() is mask:
        gm._row_plan = _last_plan[1]
    # slot ids in `gm` are positions in the gathered k / v: reading all of them in order is k itself
    n = flat.numel()

    def reader(t: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
        return lambda s: t if s.numel() == n and s.data_ptr() == flat.data_ptr() else t.index_select(0, s)

    out = _attend_segment(q, reader(k), reader(v), gm, scale, None)
    plan = getattr(gm, "_row_plan", None)
    if plan is not None:
        _last_plan = (weakref.ref(mask), plan)
    return out


@cpu_attention_segment.register_fake
def _(q, k, v, mask, q_index, out_index, dense, window, scale):
    return torch.empty_like(q)


# every layer of a step passes the same mask tensor: the host-side row plan of a verify window
# (layers/attention_decode_cpu.py `_row_plan`, one device->host read) is made once per step
_last_plan: tuple[weakref.ref, object] | None = None


@torch.library.custom_op("augury::cpu_attention_paged", mutates_args=())
def cpu_attention_paged(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, gather_slots: torch.Tensor,
                        mask: torch.Tensor, q_index: torch.Tensor | None, out_index: torch.Tensor | None,
                        dense: bool, window: int, scale: float) -> torch.Tensor:
    """The native-kernel form: q [T, H, D]; pools [S, Hkv, D]; gather_slots [B, max_kv] -> [T, H, D].
    Few-query segments run the kernel on the pools in place; prefill chunks gather + SDPA."""
    B, _, max_q, max_kv = mask.shape
    gm = GroupAttnMeta(window=None if window < 0 else window, slot_mapping=gather_slots.view(-1)[:0],
                       gather_slots=gather_slots, mask=mask, num_seqs=B, max_q=max_q, max_kv=max_kv,
                       q_index=q_index, out_index=out_index, dense=dense)
    if max_q > MAX_ROWS_WINDOW:
        return _attend_segment(q, lambda s: k_pool.index_select(0, s), lambda s: v_pool.index_select(0, s), gm,
                               scale, None)
    # every layer of a step passes the same mask tensor (one per segment): the row plan is made once
    plan = next((p for ref, p in _native_plans if ref() is mask), None)
    if plan is None:
        plan = native_attn.make_plan(mask, out_index, dense, q.shape[1], q.shape[2])
        _native_plans.insert(0, (weakref.ref(mask), plan))
        del _native_plans[4:]
    return native_attn.paged_attention_rows(q, k_pool, v_pool, gather_slots, plan, scale)


@cpu_attention_paged.register_fake
def _(q, k_pool, v_pool, gather_slots, mask, q_index, out_index, dense, window, scale):
    return torch.empty_like(q)


_native_plans: list[tuple[weakref.ref, native_attn.RowPlan]] = []  # newest first, a step's segments

native_cpu_attention()  # build / load the kernel now: a compiled forward must not do it mid-trace


def attend_compiled_cpu(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, gmeta: GroupAttnMeta,
                        scale: float) -> torch.Tensor:
    """The compiled-graph form of `attend` for plain CPU pools: one op per segment."""
    segs = [(0, q.shape[0], gmeta)] if gmeta.parts is None else gmeta.parts
    outs = []
    for lo, hi, m in segs:
        if native_cpu_attention() and native_attn.supports(q, k_pool):
            outs.append(torch.ops.augury.cpu_attention_paged(
                q[lo:hi], k_pool, v_pool, m.gather_slots, m.mask, m.q_index, m.out_index, m.dense,
                -1 if m.window is None else m.window, scale))
            continue
        flat = m.gather_slots.view(-1)
        outs.append(torch.ops.augury.cpu_attention_segment(
            q[lo:hi], k_pool.index_select(0, flat), v_pool.index_select(0, flat), m.mask, m.q_index, m.out_index,
            m.dense, -1 if m.window is None else m.window, scale))
    return outs[0] if len(outs) == 1 else torch.cat(outs)
