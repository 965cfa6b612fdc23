"""Qwen2 / Qwen2.5: the Llama block with biases on q/k/v (never on o_proj or the MLP)."""

from __future__ import annotations

from augury.models.base import AttentionBlock
from augury.models.llama import LlamaForCausalLM


class Qwen2ForCausalLM(LlamaForCausalLM):
    def attention(self, layer: int, device, dtype) -> AttentionBlock:
        return AttentionBlock(self.cfg, layer, qkv_bias=True, o_bias=False, qk_norm=False, device=device, dtype=dtype)
