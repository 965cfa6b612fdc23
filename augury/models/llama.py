"""Llama family: Llama 2/3 (incl. llama3 rope scaling), SmolLM2, Mistral-style
sliding windows. Pre-norm blocks: x + attn(norm(x)), then x + mlp(norm(x))."""

from __future__ import annotations

import torch
from torch import nn

from augury.config import ModelConfig
from augury.layers import cpu_decode, fused_decode
from augury.layers.attention import GroupAttnMeta
from augury.layers.mlp import GatedMLP
from augury.layers.norm import RMSNorm
from augury.models.base import AttentionBlock, CausalLM, WeightTarget, mlp_targets


class LlamaDecoderLayer(nn.Module):
    native_cpu_layer = True  # forward takes cpu_decode.layer_rows when eligible (so cpu_decode.run_stack may)

    def __init__(self, cfg: ModelConfig, layer: int, attn: AttentionBlock, device=None, dtype=None) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, device=device, dtype=dtype)
        self.self_attn = attn
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, device=device, dtype=dtype)
        self.mlp = GatedMLP(
            cfg.hidden_size, cfg.intermediate_size, cfg.hidden_act, bias=cfg.mlp_bias, device=device, dtype=dtype
        )

    def forward(
        self,
        h: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        gmeta: GroupAttnMeta,
        k_pool: torch.Tensor,
        v_pool: torch.Tensor,
    ) -> torch.Tensor:
        """h [T, hidden] -> [T, hidden]."""
        if h.shape[0] == 1 and fused_decode.eligible(self, h):  # batch-1 GPU decode: four fused products
            return fused_decode.llama_layer(self, h, rope, gmeta, k_pool, v_pool)
        if cpu_decode.eligible(self, h, gmeta, k_pool):  # few-row eager CPU steps: the same ops in one call
            return cpu_decode.layer_rows(self, h, rope, gmeta, k_pool, v_pool)
        h = h + self.self_attn(self.input_layernorm(h), rope, gmeta, k_pool, v_pool)
        return h + self.mlp(self.post_attention_layernorm(h))

    def weight_targets(self, prefix: str) -> dict[str, WeightTarget]:
        out = {
            f"{prefix}input_layernorm.weight": WeightTarget(self.input_layernorm.weight),
            f"{prefix}post_attention_layernorm.weight": WeightTarget(self.post_attention_layernorm.weight),
        }
        out.update(self.self_attn.weight_targets(prefix + "self_attn."))
        out.update(mlp_targets(self.mlp, prefix + "mlp."))
        return out


class LlamaForCausalLM(CausalLM):
    # attention_bias covers q/k/v and o in Llama
    def attention(self, layer: int, device, dtype) -> AttentionBlock:
        b = self.cfg.attention_bias
        return AttentionBlock(self.cfg, layer, qkv_bias=b, o_bias=b, qk_norm=False, device=device, dtype=dtype)

    def make_layer(self, layer: int, device, dtype) -> nn.Module:
        return LlamaDecoderLayer(self.cfg, layer, self.attention(layer, device, dtype), device, dtype)
