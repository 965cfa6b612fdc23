"""Gated MLP (SwiGLU / GeGLU) with one fused gate+up projection."""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from augury.config import ConfigError


def activation(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """HF `hidden_act` name -> function."""
    if name in ("silu", "swish"):
        return F.silu
    if name in ("gelu_pytorch_tanh", "gelu_tanh", "gelu_new"):
        return lambda x: F.gelu(x, approximate="tanh")
    if name == "gelu":
        return F.gelu
    raise ConfigError(f"hidden activation {name!r} is not supported; supported: silu, gelu, gelu_pytorch_tanh")


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
        # canonical name of the activation (native CPU layer: layers/cpu_decode.py)
        self.act_name = "gelu_tanh" if act in ("gelu_pytorch_tanh", "gelu_tanh", "gelu_new") else act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, hidden] -> [T, hidden]."""
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(self.act(gate) * up)
