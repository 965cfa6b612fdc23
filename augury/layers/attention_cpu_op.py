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
from augury.layers.attention import GroupAttnMeta, _attend_segment, attend_native_cpu, native_cpu_attention

_OP = "augury::cpu_attention_segment"


@torch.library.custom_op(_OP, mutates_args=())
def cpu_attention_segment(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                          q_index: torch.Tensor | None, out_index: torch.Tensor | None,
                          dense: bool, window: int, scale: float) -> torch.Tensor:
    """q [T, H, D]; k, v [B * max_kv, Hkv, D]: each request's gathered keys and values (the graph
    gathers them from the pool: a fused copy there beats index_select in here, same values);
    mask [B, 1, max_q, max_kv] bool; window -1 for full attention -> [T, H, D]."""
    B, _, _, max_kv = mask.shape
    flat = torch.arange(B * max_kv)  # k and v are gathered already: request b's key j is row b * max_kv + j
    gm = _segment_meta(flat.view(B, max_kv), mask, q_index, out_index, dense, window)
    # slot ids in `gm` are positions in the gathered k / v: reading all of them in order is k itself
    n = flat.numel()

    def reader(t: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
        return lambda s: t if s.numel() == n and s.data_ptr() == flat.data_ptr() else t.index_select(0, s)

    return _with_step_plans(gm, lambda g: _attend_segment(q, reader(k), reader(v), g, scale, None))


@cpu_attention_segment.register_fake
def _(q, k, v, mask, q_index, out_index, dense, window, scale):
    return torch.empty_like(q)


def _segment_meta(gather_slots: torch.Tensor, mask: torch.Tensor, q_index: torch.Tensor | None,
                  out_index: torch.Tensor | None, dense: bool, window: int) -> GroupAttnMeta:
    """The segment's metadata again, from what the graph passed the op (no K/V writes: slot_mapping empty)."""
    B, _, max_q, max_kv = mask.shape
    return GroupAttnMeta(window=None if window < 0 else window, slot_mapping=gather_slots.view(-1)[:0],
                         gather_slots=gather_slots, mask=mask, num_seqs=B, max_q=max_q, max_kv=max_kv,
                         q_index=q_index, out_index=out_index, dense=dense)


# Every layer of a step passes the same mask tensor per segment, but each call builds a new metadata
# object: the host-side row plans the eager paths keep on their metadata (`_row_plan` of
# layers/attention_decode_cpu.py, `_native_plan` of layers/attention.py; one device->host read each)
# are kept here by mask instead, newest first, so they are made once per step and segment.
_PLAN_ATTRS = ("_row_plan", "_native_plan")
_step_plans: list[tuple[weakref.ref, dict[str, object]]] = []


def _with_step_plans(gm: GroupAttnMeta, attend: Callable[[GroupAttnMeta], torch.Tensor]) -> torch.Tensor:
    plans = next((p for ref, p in _step_plans if ref() is gm.mask), None)
    for name, plan in (plans or {}).items():
        setattr(gm, name, plan)
    out = attend(gm)
    if plans is None:
        made = {name: getattr(gm, name) for name in _PLAN_ATTRS if getattr(gm, name, None) is not None}
        if made:
            _step_plans.insert(0, (weakref.ref(gm.mask), made))
            del _step_plans[4:]
    return out


@torch.library.custom_op("augury::cpu_attention_paged", mutates_args=())
def cpu_attention_paged(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, gather_slots: torch.Tensor,
                        mask: torch.Tensor, q_index: torch.Tensor | None, out_index: torch.Tensor | None,
                        dense: bool, window: int, scale: float) -> torch.Tensor:
    """The native-kernel form: q [T, H, D]; pools [S, Hkv, D]; gather_slots [B, max_kv] -> [T, H, D].
    Few-query segments run the kernel on the pools in place; prefill chunks gather + SDPA."""
    gm = _segment_meta(gather_slots, mask, q_index, out_index, dense, window)
    return _with_step_plans(gm, lambda g: attend_native_cpu(q, k_pool, v_pool, g, scale))


@cpu_attention_paged.register_fake
def _(q, k_pool, v_pool, gather_slots, mask, q_index, out_index, dense, window, scale):
    return torch.empty_like(q)


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
