"""argmax over the last dim, as torch.argmax(x, -1) bit for bit (ties -> lowest index, NaN first):
on CPU float32 rows through the native kernel (`argmax.cpp`: torch's CPU argmax is not vectorized,
~170 us for 8 SmolLM2 rows against ~20), anything else through torch."""

from __future__ import annotations

import torch

from augury.cpu_kernels.build import available


def argmax_last(x: torch.Tensor) -> torch.Tensor:
    """-> long, x's shape without its last dim."""
    if (x.device.type == "cpu" and x.dtype == torch.float32 and x.dim() >= 1 and x.shape[-1] > 0
            and available() and not torch.compiler.is_compiling()):
        return _rows(x.reshape(-1, x.shape[-1]).contiguous()).view(x.shape[:-1])
    return x.argmax(dim=-1)


def _rows(x: torch.Tensor) -> torch.Tensor:
    return torch.ops.augury_cpu.argmax_rows(x)
