"""RMSNorm in the two HF flavours.

Both normalize in float32. Llama-style multiplies by `weight` after casting
back to the compute dtype; Gemma-style multiplies by `(1 + weight)` in float32
and casts last. The weight may be [D] or [n, D] (per-head weights of a fused
q/k norm over [T, n, D]).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from augury.cpu_kernels import load
from augury.layers import row_ops


class RMSNorm(nn.Module):
    def __init__(
        self,
        shape: int | tuple[int, ...],
        eps: float,
        gemma_style: bool = False,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        init = torch.zeros if gemma_style else torch.ones
        self.weight = nn.Parameter(init(shape, device=device, dtype=dtype))
        self.eps = eps
        self.gemma_style = gemma_style

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., D] (trailing dims must broadcast with weight) -> same shape and dtype."""
        d = (x.shape[-1],)
        if x.device.type == "cpu" and not torch.compiler.is_compiling() and _native():
            # eager CPU steps: augury's kernel (cpu_kernels/rms_norm.cpp), one call for torch's several;
            # compiled graphs keep torch's op, which inductor fuses with its neighbours (measured faster
            # than an opaque call there). The weight is applied as below
            h = torch.ops.augury_cpu.rms_norm(x.float().reshape(-1, d[0]).contiguous(), self.eps).view(x.shape)
            if self.gemma_style:
                return (h * (1.0 + self.weight.float())).to(x.dtype)
            return self.weight * h.to(x.dtype)
        if self.gemma_style:
            h = F.rms_norm(x.float(), d, None, self.eps)
            return (h * (1.0 + self.weight.float())).to(x.dtype)
        if x.dtype == torch.float32 and self.weight.dim() == 1:
            return F.rms_norm(x, d, self.weight, self.eps)  # one dispatch, bit-identical to HF's steps
        if row_ops.norm_in_dtype(x):
            # a GPU bf16 step: torch's kernel accumulates in float32 from bf16 rows as from their float32
            # copy (same bits), so the copy and the cast back are two launches saved; the weight product
            # takes one Triton launch only where row_ops' mul_rows step is switched on (opt-in)
            h = F.rms_norm(x, d, None, self.eps)
            if self.weight.dim() == 1 and (y := row_ops.mul_rows(h.reshape(-1, d[0]), self.weight)) is not None:
                return y.view(x.shape)
            return self.weight * h
        return self.weight * F.rms_norm(x.float(), d, None, self.eps).to(x.dtype)

    def reset_weight(self) -> None:
        """Identity scale (used for random-weight models)."""
        with torch.no_grad():
            self.weight.fill_(0.0 if self.gemma_style else 1.0)

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)}, eps={self.eps}, gemma_style={self.gemma_style}"


_NATIVE: bool | None = None  # None: use the native kernel when the library loaded (tests set False)


def _native() -> bool:
    return load() if _NATIVE is None else _NATIVE
