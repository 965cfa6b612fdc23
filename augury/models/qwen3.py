"""Qwen3 (dense): the Llama block plus per-head RMSNorm on q and k before rope."""

from __future__ import annotations

from augury.models.base import AttentionBlock
from augury.models.llama import LlamaForCausalLM


class Qwen3ForCausalLM(LlamaForCausalLM):
    def attention(self, layer: int, device, dtype) -> AttentionBlock:
        b = self.cfg.attention_bias
        return AttentionBlock(self.cfg, layer, qkv_bias=b, o_bias=b, qk_norm=True, device=device, dtype=dtype)
