"""Gemma 3 (text): sandwich norms around attention and MLP, all RMSNorms scale by
(1 + w) in float32, q/k norm, GeGLU (tanh), embeddings scaled by sqrt(hidden),
query_pre_attn_scalar attention scale, sliding-window layers with their own
rope base (`rope_local`) interleaved with global layers, tied LM head."""

from __future__ import annotations

import torch
from torch import nn

from augury.config import ModelConfig
from augury.layers import cpu_decode
from augury.layers.attention import GroupAttnMeta
from augury.layers.mlp import GatedMLP
from augury.layers.norm import RMSNorm
from augury.models.base import AttentionBlock, CausalLM, WeightTarget, mlp_targets

_NORMS = ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm")


class Gemma3DecoderLayer(nn.Module):
    native_cpu_layer = True  # forward takes cpu_decode.layer_rows when eligible (so cpu_decode.run_stack may)

    def __init__(self, cfg: ModelConfig, layer: int, device=None, dtype=None) -> None:
        super().__init__()
        for name in _NORMS:
            setattr(self, name, RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, gemma_style=True, device=device, dtype=dtype))
        b = cfg.attention_bias
        self.self_attn = AttentionBlock(
            cfg, layer, qkv_bias=b, o_bias=b, qk_norm=True, gemma_norm=True, device=device, dtype=dtype
        )
        self.mlp = GatedMLP(cfg.hidden_size, cfg.intermediate_size, cfg.hidden_act, device=device, dtype=dtype)

    def forward(
        self,
        h: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        gmeta: GroupAttnMeta,
        k_pool: torch.Tensor,
        v_pool: torch.Tensor,
    ) -> torch.Tensor:
        """h [T, hidden] -> [T, hidden]."""
        if cpu_decode.eligible(self, h, gmeta, k_pool):  # few-row eager CPU steps: the same ops in one call
            return cpu_decode.layer_rows(self, h, rope, gmeta, k_pool, v_pool)
        a = self.self_attn(self.input_layernorm(h), rope, gmeta, k_pool, v_pool)
        h = h + self.post_attention_layernorm(a)
        m = self.mlp(self.pre_feedforward_layernorm(h))
        return h + self.post_feedforward_layernorm(m)

    def weight_targets(self, prefix: str) -> dict[str, WeightTarget]:
        out = {f"{prefix}{n}.weight": WeightTarget(getattr(self, n).weight) for n in _NORMS}
        out.update(self.self_attn.weight_targets(prefix + "self_attn."))
        out.update(mlp_targets(self.mlp, prefix + "mlp."))
        return out


class Gemma3ForCausalLM(CausalLM):
    gemma_norms = True

    def embed_scale(self) -> float | None:
        return self.cfg.hidden_size**0.5

    def make_layer(self, layer: int, device, dtype) -> nn.Module:
        return Gemma3DecoderLayer(self.cfg, layer, device, dtype)
