"""A decoder layer of a few-row eager CPU step as one native call (Llama-style and Gemma 3 layers).

Eager CPU decode spends about as long in Python between ~15 small calls per layer as in the int4
products themselves. `augury_cpu::decoder_layer_rows` (cpu_kernels/decoder_layer.cpp) makes the same
calls, in the same order and with the same casts, from C++, so its results are bitwise those of the
modules' own forward (tested). Used where that forward would run augury's native kernels throughout:
int4 weights on the native kernel (no bias, no padding), RMSNorms of one eps, SiLU or GELU-tanh, plain
pools, no softcap, and steps of at most MAX_ROWS_WINDOW rows per request (decodes, verify windows, small
batches); everything else, and torch.compile traces, take the modules. `AUGURY_CPU_LAYER=0` turns it off.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch import nn

from augury.cpu_kernels import attention as native_attn
from augury.cpu_kernels import load
from augury.layers import attention as attn_mod
from augury.layers.norm import RMSNorm
from augury.layers.quant_linear import Int4Linear

_ENV_ON = os.environ.get("AUGURY_CPU_LAYER", "1") != "0"
FORCE: bool | None = None  # tests: False turns the path off


def _int4(lin: nn.Module, rows: int) -> bool:
    return (isinstance(lin, Int4Linear) and lin._native and lin._plain and lin.packed.device.type == "cpu"
            and (lin.dense_weight is None or rows < lin.dense_min_rows))


def _norms(layer: nn.Module) -> tuple[list, list]:
    """(norm_in, norm_mlp, norm_attn_out, norm_mlp_out) of a Llama-style or Gemma 3 layer, and the
    q/k norm (None when absent)."""
    if hasattr(layer, "pre_feedforward_layernorm"):  # Gemma 3: sandwich norms
        outer = [layer.input_layernorm, layer.pre_feedforward_layernorm, layer.post_attention_layernorm,
                 layer.post_feedforward_layernorm]
    else:
        outer = [layer.input_layernorm, layer.post_attention_layernorm, None, None]
    return outer, [layer.self_attn.qk_norm]


def _act(mlp: nn.Module) -> int | None:
    if mlp.act is F.silu:
        return 0
    return 1 if getattr(mlp, "act_name", None) == "gelu_tanh" else None


def eligible(layer: nn.Module, h: torch.Tensor, gmeta, k_pool) -> bool:
    if not (_ENV_ON if FORCE is None else FORCE):
        return False
    if h.device.type != "cpu" or h.dim() != 2 or torch.compiler.is_compiling() or not load():
        return False
    if not hasattr(torch.ops.augury_cpu, "decoder_layer_rows"):
        return False
    attn, mlp = layer.self_attn, layer.mlp
    T = h.shape[0]
    lins = (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj)
    outer, (qk,) = _norms(layer)
    norms = [n for n in outer + [qk] if n is not None]
    gemma = {n.gemma_style for n in norms}
    return (attn.softcap is None and all(_int4(m, T) for m in lins) and len({m.group_size for m in lins}) == 1
            and all(isinstance(n, RMSNorm) for n in norms) and len(gemma) == 1
            and len({n.eps for n in norms}) == 1 and all(n.weight.dim() == 1 for n in outer if n is not None)
            and _act(mlp) is not None
            and attn_mod.native_cpu_attention() and native_attn.supports(h, k_pool)
            and gmeta.max_q <= attn_mod.MAX_ROWS_WINDOW)


def layer_rows(layer: nn.Module, h: torch.Tensor, rope, gmeta, k_pool, v_pool) -> torch.Tensor:
    """h [T, hidden] -> [T, hidden]; `eligible` must hold."""
    attn, mlp = layer.self_attn, layer.mlp
    plan = getattr(gmeta, "_native_plan", None)  # made once per step, shared by the layers
    if plan is None:
        plan = native_attn.make_plan(gmeta.mask, gmeta.out_index, gmeta.dense, attn.num_heads, attn.head_dim)
        gmeta._native_plan = plan
    (n_in, n_mlp, n_attn_out, n_mlp_out), (qk,) = _norms(layer)
    w = [None if n is None else n.weight for n in (n_attn_out, n_mlp_out, qk)]
    qkv, o, gu, down = attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj
    cos, sin = rope
    return torch.ops.augury_cpu.decoder_layer_rows(
        h, n_in.weight, n_mlp.weight, w[0], w[1], w[2], n_in.eps, n_in.gemma_style, _act(mlp),
        qkv.packed, qkv.native_scales, o.packed, o.native_scales, gu.packed, gu.native_scales,
        down.packed, down.native_scales, qkv.group_size, cos, sin, k_pool, v_pool, gmeta.slot_mapping,
        gmeta.gather_slots, plan.rows, attn.scale, plan.parallel, attn.num_heads, attn.num_kv_heads, attn.head_dim)
