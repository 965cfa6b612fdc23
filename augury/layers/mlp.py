"""Gated MLP (SwiGLU / GeGLU) with one fused gate+up projection."""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from augury.config import ConfigError
from augury.layers import row_ops


_CANONICAL = {"silu": "silu", "swish": "silu", "gelu_pytorch_tanh": "gelu_tanh", "gelu_tanh": "gelu_tanh",
              "gelu_new": "gelu_tanh", "gelu": "gelu"}


def canonical_activation(name: str) -> str:
    """HF `hidden_act` name -> "silu" | "gelu_tanh" | "gelu"."""
    if name not in _CANONICAL:
        raise ConfigError(f"hidden activation {name!r} is not supported; supported: silu, gelu, gelu_pytorch_tanh")
    return _CANONICAL[name]


def activation(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """HF `hidden_act` name -> function."""
    kind = canonical_activation(name)
    if kind == "silu":
        return F.silu
    if kind == "gelu_tanh":
        return lambda x: F.gelu(x, approximate="tanh")
    return F.gelu


class GatedMLP(nn.Module):
    """down(act(gate(x)) * up(x)); `gate_up_proj` holds [gate; up] stacked on the output dim."""

    def __init__(
        self,
        hidden_size: int,
        intermediate_size: int,
        act: str,
        bias: bool = False,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.intermediate_size = intermediate_size
        self.gate_up_proj = nn.Linear(hidden_size, 2 * intermediate_size, bias=bias, device=device, dtype=dtype)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=bias, device=device, dtype=dtype)
        self.act = activation(act)
        self.act_name = canonical_activation(act)  # what the fused paths dispatch on

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, hidden] -> [T, hidden]."""
        gu = self.gate_up_proj(x)
        if self.act_name == "silu" and (h := row_ops.silu_mul(gu)) is not None:
            return self.down_proj(h)  # one launch on the GPU (bitwise the two below)
        gate, up = gu.chunk(2, dim=-1)
        return self.down_proj(self.act(gate) * up)
