"""A pre-norm (Llama-style) decoder layer for one-token GPU steps in four fused products.

    h = h + o_proj(attn(qkv_proj(norm1(h))))      ->  qkv = gemv(h, norm=norm1); h = gemv(o, residual=h)
    h = h + down(silu(gate) * up)(norm2(h))        ->  gu = gemv(h, norm=norm2); h = gemv(gu, silu_mul, residual=h)

so a layer launches the four weight streams, rope/K-V write and attention, instead of
~16 kernels (`layers/triton_gemv.py` says why that matters at batch 1). Used for
steps of exactly one token (batch-1 decode, each step of a batch-1 burst) on CUDA;
every other step, and layers it does not cover (biases, int8 or padded int4 weights,
Gemma-style norms, other activations), take the unfused modules. Int4 projections
(`Int4Linear` on CUDA) take the split-K GEMV only with AUGURY_INT4_GEMV=1 (faster than tinygemm on the
H200, but it keeps copies of the scales and of the nibbles: by default the tensor-core GEMV's tiles,
`layers/triton_gemv_w4m.py`, where a shape fits them, else the row layout, `layers/triton_gemv_w4r.py`;
`AUGURY_INT4_GEMV_LAYOUT=rows` takes the row layout everywhere, `=tinygemm` reads tinygemm's bytes in place,
`layers/triton_gemv_w4.py`; `quant_linear._INT4_GEMV_ON`).

`AUGURY_FUSED_DECODE=0` turns it off (A/B measurements); tests force it on under the
Triton interpreter through `FORCE`.
"""

from __future__ import annotations

import os

import torch
from torch import nn

from augury.layers.norm import RMSNorm
from augury.layers.quant_linear import Int4Linear, gemv_kernels_ok

FORCE: bool | None = None  # None: CUDA only, unless AUGURY_FUSED_DECODE=0; True/False: tests
_ENV_ON = os.environ.get("AUGURY_FUSED_DECODE", "1") != "0"  # read once: compiled graphs see a constant
_ROPE_KV_ON = os.environ.get("AUGURY_FUSED_ROPE_KV", "1") != "0"  # the rope + K/V epilogue (A/B measurements)
# attention leaves its split partials to o_proj's prologue: opt-in (=1; =int4: only where o_proj is an int4
# tensor-core product, which splits K anyway). On the H200 (docs/benchmarks.md, twenty-third and twenty-fourth
# sessions) it takes 3.9-4.1 us a layer out of attention, but the merge in front of every o_proj program costs
# more: bf16 (split-K o_proj) 247.4 against 252.5 tok/s end to end, int4 431.8 against 446.8
_DEFER_MERGE = os.environ.get("AUGURY_DEFER_MERGE", "0")
# attention asks the L2 for o_proj's int4 weight and scales while it leaves the DRAM idle: opt-in (=1). On an H100
# (forty-first session) the layer chain read 72.4 against 72.05 us and int4 B=1 411.4 / 411.9 against 413.6 / 413.3
# tok/s (0.995x): o_proj's weight was not what the layer waited for
_WARM_O = os.environ.get("AUGURY_ATTN_WARM_O", "0") != "0"
if _DEFER_MERGE not in ("0", "1", "int4"):
    raise ValueError(f"AUGURY_DEFER_MERGE={_DEFER_MERGE!r}: use 0, 1 or int4")


def _on() -> bool:
    return _ENV_ON if FORCE is None else FORCE


def _weight(lin: nn.Module, dtype: torch.dtype) -> dict | None:
    """The weight keywords of `gemv` for this projection (a plain bias-free nn.Linear in the
    activation dtype, or an `Int4Linear` in tinygemm's CUDA layout with bf16 activations), or None."""
    if type(lin) is nn.Linear:
        ok = lin.bias is None and lin.weight.dtype == dtype and lin.weight.stride(1) == 1
        return {"w": lin.weight} if ok else None
    if isinstance(lin, Int4Linear) and dtype == torch.bfloat16:
        return lin.gemv_weight()
    return None


def _llama_norm(norm: nn.Module) -> bool:
    return isinstance(norm, RMSNorm) and not norm.gemma_style and norm.weight.dim() == 1


def _one_token_gpu_step(h: torch.Tensor) -> bool:
    """Whether h [1, hidden] is a one-token step the fused kernels serve: one row, the path on, a CUDA
    device (or the interpreter when tests force the path), and the Triton kernels importable (compiled
    CUDA graphs need triton anyway: inductor writes its GPU kernels in it)."""
    return (h.dim() == 2 and h.shape[0] == 1 and _on()
            and (h.device.type == "cuda" or (FORCE and os.environ.get("TRITON_INTERPRET") == "1"))
            and (torch.compiler.is_compiling() or gemv_kernels_ok()))


def eligible(layer: nn.Module, h: torch.Tensor) -> bool:
    """Whether `llama_layer` computes this layer for this input (decided from types and shapes,
    so a compiled graph resolves it once)."""
    if not _one_token_gpu_step(h):
        return False
    attn, mlp = layer.self_attn, layer.mlp
    return (h.dtype in (torch.bfloat16, torch.float16, torch.float32)
            and all(_weight(lin, h.dtype) is not None
                    for lin in (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj))
            and _llama_norm(layer.input_layernorm) and _llama_norm(layer.post_attention_layernorm)
            and mlp.act_name == "silu")


def final_norm(norm: nn.Module, h: torch.Tensor) -> torch.Tensor:
    """The model's last norm on h: one kernel (`triton_gemv.rms_norm_row`) in a one-token GPU step,
    the module otherwise. Compiled steps call the same kernel (a custom op): the same bits as eager."""
    if (_one_token_gpu_step(h) and _llama_norm(norm)
            and h.dtype in (torch.bfloat16, torch.float16, torch.float32) and norm.weight.dtype == h.dtype):
        from augury.layers.triton_gemv import fused_rms_norm_row

        return fused_rms_norm_row(h, norm.weight, norm.eps)
    return norm(h)


def head(lm_head: nn.Module, h: torch.Tensor) -> torch.Tensor:
    """The LM head on h: the one-row GEMV (`triton_gemv.gemv`) in a one-token GPU step, the module
    otherwise. On the H200 the GEMV reads the 8B head (1.05 GB bf16) 6.4 us faster than cuBLAS
    (234.7 vs 241.1 us, docs/benchmarks.md, nineteenth session); an int4 head takes its own GEMV
    inside `Int4Linear` already."""
    w = _weight(lm_head, h.dtype) if type(lm_head) is nn.Linear else None
    if w is not None and _one_token_gpu_step(h):
        from augury.layers.triton_gemv import fused_gemv

        return fused_gemv(h, **w)
    return lm_head(h)


def _rope_kv_fusable(attn: nn.Module, h: torch.Tensor, rope, gmeta, k_pool, v_pool) -> bool:
    """Whether the qkv kernel can also apply rope and write this token's K/V: plain pools in the
    activation dtype (encoded or several-class stores encode on write), no q/k norm, full-width
    rope rows in the activation dtype, head_dim in whole 8-row blocks."""
    cos, sin = rope
    D = attn.head_dim
    pools_ok = all(isinstance(p, torch.Tensor) and p.dim() == 3 and p.dtype == h.dtype and p.stride(-1) == 1
                   for p in (k_pool, v_pool))
    return (_ROPE_KV_ON and pools_ok and attn.qk_norm is None and D % 8 == 0 and getattr(gmeta, "write_split", None) is None
            and getattr(gmeta, "codec_parts", None) is None
            and cos.shape[-1] == D and cos.numel() == D and sin.numel() == D
            and cos.dtype == h.dtype and sin.dtype == h.dtype)


def _partials(q: torch.Tensor, attn: nn.Module, h: torch.Tensor, gmeta, k_pool, v_pool):
    """Attention of this one-token step as split partials for o_proj to merge (`triton_paged_decode.
    attend_partials`; a plain o_proj then runs the split-K GEMV, `triton_gemv_split`), or None where o_proj
    cannot merge them (the row and tinygemm int4 layouts, shapes the merging GEMVs do not take) or the
    step does not fit the kernel."""
    if _DEFER_MERGE == "0" or (q.device.type != "cuda" and q.dtype == torch.bfloat16):
        # off the GPU (tests under TRITON_INTERPRET=1) the interpreter's bf16 dots are wrong (numpy has no
        # bf16), so bf16 steps there keep the CPU attention, as `attend_written` does for every dtype
        return None
    w = _weight(attn.o_proj, h.dtype)
    D = attn.head_dim
    if w.get("scales_zeros") is not None:
        if w["w"].dim() != 3 or 256 % D:  # the tensor-core GEMV (3-d tiles) merges 256-column blocks
            return None
    else:
        if _DEFER_MERGE == "int4":
            return None
        from augury.layers import triton_gemv_split

        if not triton_gemv_split.supported(*w["w"].shape, D):
            return None
    from augury.layers.triton_paged_decode import attend_partials  # triton is there: the fused path needs it

    return attend_partials(q, k_pool, v_pool, gmeta, attn.scale, attn.softcap)


def llama_layer(layer: nn.Module, h: torch.Tensor, rope, gmeta, k_pool, v_pool) -> torch.Tensor:
    """One pre-norm layer on h [1, hidden] -> [1, hidden]; `eligible(layer, h)` must hold."""
    from augury.layers.attention import attend_written
    from augury.layers.triton_gemv import fused_gemv, fused_qkv_rope_kv

    attn, mlp = layer.self_attn, layer.mlp
    n1, n2 = layer.input_layernorm, layer.post_attention_layernorm
    if _rope_kv_fusable(attn, h, rope, gmeta, k_pool, v_pool):
        # qkv + rope + the K/V write in one kernel, then attention over the pools
        H, D = attn.num_heads, attn.head_dim
        q = fused_qkv_rope_kv(h, **_weight(attn.qkv_proj, h.dtype), norm_weight=n1.weight, eps=n1.eps,
                              cos=rope[0], sin=rope[1], k_pool=k_pool, v_pool=v_pool, slot=gmeta.slot_mapping,
                              num_heads=H, num_kv_heads=attn.num_kv_heads)
        parts = _partials(q.view(1, H, D), attn, h, gmeta, k_pool, v_pool)
        if parts is not None:  # o_proj merges attention's splits in its prologue
            h = fused_gemv(parts[0], **_weight(attn.o_proj, h.dtype), residual=h, merge_ml=parts[1])
            gu = fused_gemv(h, **_weight(mlp.gate_up_proj, h.dtype), norm_weight=n2.weight, eps=n2.eps)
            return fused_gemv(gu, **_weight(mlp.down_proj, h.dtype), silu_mul=True, residual=h)
        warm = ()
        if _WARM_O:  # attention asks the L2 for o_proj's weight (`triton_paged_decode.l2_warm_tensors`)
            from augury.layers.triton_paged_decode import l2_warm_tensors

            warm = l2_warm_tensors(_weight(attn.o_proj, h.dtype))
        o = attend_written(q.view(1, H, D), k_pool, v_pool, gmeta, attn.scale, attn.softcap,
                           l2_warm=warm).reshape(1, H * D)
    else:
        qkv = fused_gemv(h, **_weight(attn.qkv_proj, h.dtype), norm_weight=n1.weight, eps=n1.eps)
        o = attn.attend(qkv, rope, gmeta, k_pool, v_pool)
    h = fused_gemv(o, **_weight(attn.o_proj, h.dtype), residual=h)
    gu = fused_gemv(h, **_weight(mlp.gate_up_proj, h.dtype), norm_weight=n2.weight, eps=n2.eps)
    return fused_gemv(gu, **_weight(mlp.down_proj, h.dtype), silu_mul=True, residual=h)
