"""A decoder layer of a few-row eager CPU step as one native call (Llama-style and Gemma 3 layers).

Eager CPU decode spends about as long in Python between ~15 small calls per layer as in the int4
products themselves. `augury_cpu::decoder_layer_rows` (cpu_kernels/decoder_layer.cpp) calls augury's
kernels directly and does the elementwise steps in loops with the same operations in the same order,
so its results are bitwise those of the modules' own forward (tested). Used where that forward would
run augury's native kernels throughout: float32 activations, int4 weights on the native kernel (no
bias, no padding), RMSNorms of one eps, SiLU or GELU-tanh, plain pools, no softcap, and steps of at
most MAX_ROWS_WINDOW rows per request (decodes, verify windows, small batches); everything else, and
torch.compile traces, take the modules. `AUGURY_CPU_LAYER=0` turns it off.
"""

from __future__ import annotations

import math
import os
import weakref

import torch
from torch import nn

from augury.cpu_kernels import attention as native_attn
from augury.cpu_kernels import load
from augury.layers import attention as attn_mod
from augury.layers.norm import RMSNorm
from augury.layers import quant_linear
from augury.layers.quant_linear import Int4Linear

_ENV_ON = os.environ.get("AUGURY_CPU_LAYER", "1") != "0"
FORCE: bool | None = None  # tests: False turns the path off
# one native call per step for all layers (run_stack); False: one per layer (AUGURY_CPU_STACK=0, tests)
STACK: bool = os.environ.get("AUGURY_CPU_STACK", "1") != "0"


# per layer, the most rows its modules let the native call take (0: never); see _rows_allowed
_ALLOWED: weakref.WeakKeyDictionary[nn.Module, float] = weakref.WeakKeyDictionary()
_ACT = {"silu": 0, "gelu_tanh": 1}  # decoder_layer.cpp's activation codes
# per layer, (quant_linear.PACK_GENERATION when built, the op's constant arguments): see _constants
_CONSTS: weakref.WeakKeyDictionary[nn.Module, tuple] = weakref.WeakKeyDictionary()


def _norms(layer: nn.Module) -> tuple[list, nn.Module | None]:
    """(norm_in, norm_mlp, norm_attn_out, norm_mlp_out) of a Llama-style or Gemma 3 layer, and the
    q/k norm (None when absent)."""
    if hasattr(layer, "pre_feedforward_layernorm"):  # Gemma 3: sandwich norms
        outer = [layer.input_layernorm, layer.pre_feedforward_layernorm, layer.post_attention_layernorm,
                 layer.post_feedforward_layernorm]
    else:
        outer = [layer.input_layernorm, layer.post_attention_layernorm, None, None]
    return outer, layer.self_attn.qk_norm


def _rows_allowed(layer: nn.Module) -> float:
    """From the layer's module types alone: 0 when the native call cannot run it, else the row count
    from which an int4 module's dense copy (prefill) takes over. Decided once per layer: eligibility
    runs per layer per step, and the model does not change after loading (Int4Linear repacks only on
    a device move, which the per-step device check catches)."""
    got = _ALLOWED.get(layer)
    if got is None:
        got = _ALLOWED[layer] = _structure(layer)
    return got


def _structure(layer: nn.Module) -> float:
    attn, mlp = layer.self_attn, layer.mlp
    lins = (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj)
    outer, qk = _norms(layer)
    norms = [n for n in outer + [qk] if n is not None]
    ok = (hasattr(torch.ops.augury_cpu, "decoder_layer_rows") and attn.softcap is None
          and all(isinstance(m, Int4Linear) and m._native and m._plain and m.packed.device.type == "cpu"
                  for m in lins)
          and len({m.group_size for m in lins}) == 1
          and all(isinstance(n, RMSNorm) for n in norms) and len({n.gemma_style for n in norms}) == 1
          and len({n.eps for n in norms}) == 1 and all(n.weight.dim() == 1 for n in outer if n is not None)
          and mlp.act_name in _ACT)
    if not ok:
        return 0
    return min((m.dense_min_rows for m in lins if m.dense_weight is not None), default=math.inf)


def _input_ok(h: torch.Tensor) -> bool:
    """The path is on and this step's input can take it (eager float32 rows on the CPU, kernels loaded)."""
    if not (_ENV_ON if FORCE is None else FORCE):
        return False
    return (h.device.type == "cpu" and h.dim() == 2 and h.dtype == torch.float32
            and not torch.compiler.is_compiling() and load() and attn_mod.native_cpu_attention())


def eligible(layer: nn.Module, h: torch.Tensor, gmeta, k_pool) -> bool:
    return (_input_ok(h) and h.shape[0] < _rows_allowed(layer) and gmeta.max_q <= attn_mod.MAX_ROWS_WINDOW
            and native_attn.supports(h, k_pool))


def _constants(layer: nn.Module) -> tuple[tuple, tuple]:
    """The op's per-layer arguments that never change (weights, eps, shapes), before and after the
    per-step ones; built once per layer (a step passes ~30 arguments per layer)."""
    gen = quant_linear.PACK_GENERATION
    got = _CONSTS.get(layer)
    if got is None or got[0] != gen:  # some int4 weight was packed anew (a device move, a load): build again
        attn, mlp = layer.self_attn, layer.mlp
        (n_in, n_mlp, n_attn_out, n_mlp_out), qk = _norms(layer)
        w = [None if n is None else n.weight for n in (n_attn_out, n_mlp_out, qk)]
        qkv, o, gu, down = attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj
        pre = (n_in.weight, n_mlp.weight, w[0], w[1], w[2], n_in.eps, n_in.gemma_style, _ACT[mlp.act_name],
               qkv.packed, qkv.native_scales, o.packed, o.native_scales, gu.packed, gu.native_scales,
               down.packed, down.native_scales, qkv.group_size)
        post = (attn.num_heads, attn.num_kv_heads, attn.head_dim)
        got = _CONSTS[layer] = (gen, pre, post)
    return got[1], got[2]


def _plan(gmeta, attn: nn.Module) -> native_attn.RowPlan:
    """The step's native attention plan for a KV group: made once per step, shared by the layers."""
    plan = getattr(gmeta, "_native_plan", None)
    if plan is None:
        plan = gmeta._native_plan = native_attn.make_plan(gmeta.mask, gmeta.out_index, gmeta.dense, attn.num_heads,
                                                          attn.head_dim)
    return plan


def layer_rows(layer: nn.Module, h: torch.Tensor, rope, gmeta, k_pool, v_pool) -> torch.Tensor:
    """h [T, hidden] -> [T, hidden]; `eligible` must hold."""
    plan = _plan(gmeta, layer.self_attn)
    pre, post = _constants(layer)
    cos, sin = rope
    return torch.ops.augury_cpu.decoder_layer_rows.default(
        h, *pre, cos, sin, k_pool, v_pool, gmeta.slot_mapping, gmeta.gather_slots, plan.rows,
        layer.self_attn.scale, plan.parallel, *post)


# per model: its native LayerStack and what it was built from; see _stack
_STACK: weakref.WeakKeyDictionary[nn.Module, "_Stack | None"] = weakref.WeakKeyDictionary()


class _Stack:
    """A model's layers as one `augury_cpu::LayerStack` (decoder_layer.cpp), for `run_stack`."""

    def __init__(self, model: nn.Module):
        layers = list(model.layers)
        self.generation = quant_linear.PACK_GENERATION
        self.allowed = min(_rows_allowed(l) for l in layers)  # rows below which every layer may run natively
        self.windows = [l.self_attn.window for l in layers]
        self.groups = model.kv_group_of_layer()
        self.group_names = sorted(set(self.groups))
        self.rope_names = sorted({l.self_attn.rope_name for l in layers})
        self.obj = torch.classes.augury_cpu.LayerStack()
        for l, g in zip(layers, self.groups):
            pre, post = _constants(l)
            self.obj.add(*pre, *post, l.self_attn.scale, self.rope_names.index(l.self_attn.rope_name),
                         self.group_names.index(g))


def _has_stack_class() -> bool:
    try:  # torch.classes raises (rather than returning a default) for a class it does not know
        return torch.classes.augury_cpu.LayerStack is not None
    except (RuntimeError, AttributeError):
        return False


def _stack(model: nn.Module) -> _Stack | None:
    """The model's stack, built on first use and again after any int4 weight is packed anew; None
    (kept, as `_rows_allowed` keeps its answer) when some layer can never take the native call."""
    got = _STACK.get(model, False)
    if got is False or (got is not None and got.generation != quant_linear.PACK_GENERATION):
        layers = list(model.layers)
        ok = (layers and all(getattr(l, "native_cpu_layer", False) for l in layers)
              and _has_stack_class() and all(_rows_allowed(l) for l in layers))
        got = _STACK[model] = _Stack(model) if ok else None
    return got


def run_stack(model: nn.Module, h: torch.Tensor, ropes: dict, meta, kv, n: int) -> torch.Tensor | None:
    """The first n layers of `model` on h [T, hidden] in one native call, when every one of them would
    take `layer_rows` this step (the same per-layer code, so the same bits); else None and the caller
    runs the modules. One call per step instead of a module call, `eligible` and an op call per layer:
    those came to ~1.5-2 ms of a ~13 ms SmolLM2 CPU decode step (Python whose objects are cold after
    each layer's weights stream through the caches)."""
    if not STACK or not _input_ok(h):
        return None
    st = _stack(model)
    if st is None or h.shape[0] >= st.allowed or list(kv.group_of_layer[:n]) != st.groups[:n]:
        return None
    metas = [meta.groups[g] if g in meta.groups else None for g in st.group_names]
    used = {st.groups[i] for i in range(n)}
    for g, gm in zip(st.group_names, metas):
        if g in used and (gm is None or gm.max_q > attn_mod.MAX_ROWS_WINDOW):
            return None
    for i in range(n):  # all checked before the first layer writes its K/V
        # (a window mismatch: the module loop raises its error, models/base.py)
        if meta.groups[st.groups[i]].window != st.windows[i] or not native_attn.supports(h, kv.k[i]):
            return None
    # (a group these n layers do not read gets placeholders)
    plans = [None if gm is None else _plan(gm, model.layers[0].self_attn) for gm in metas]
    empty = h.new_empty(0)
    cos = [ropes[r][0] for r in st.rope_names]
    sin = [ropes[r][1] for r in st.rope_names]
    return torch.ops.augury_cpu.decoder_stack_rows.default(
        st.obj, h, n, cos, sin, kv.k[:n], kv.v[:n],
        [empty if gm is None else gm.slot_mapping for gm in metas],
        [empty if gm is None else gm.gather_slots for gm in metas],
        [empty if p is None else p.rows for p in plans],
        [0 if p is None else int(p.parallel) for p in plans])
