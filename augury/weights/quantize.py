"""`--weights native|int8|int4`: swap a model's nn.Linear projections for quantized ones,
and build int4 modules straight from GGUF 4-bit blocks (no re-quantization)."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from augury.layers.quant_linear import GROUP_SIZES, Int4Linear, Int4Parts, Int8Linear

WEIGHT_MODES = ("native", "int8", "int4")
_QK4 = 32  # GGUF Q4_0 / Q4_1 block length


def check_weight_mode(mode: str, group_size: int = 32) -> None:
    if mode not in WEIGHT_MODES:
        raise ValueError(f"weights must be one of {', '.join(WEIGHT_MODES)}, got {mode!r}")
    if mode == "int4" and group_size not in GROUP_SIZES:
        raise ValueError(f"int4 group size must be one of {GROUP_SIZES}, got {group_size}")


def _is_lm_head(name: str) -> bool:
    return name.split(".")[-1] == "lm_head"


def quantize_model(
    model: nn.Module,
    mode: str,
    group_size: int = 32,
    include_lm_head: bool = True,
    act_dtype: torch.dtype = torch.bfloat16,
) -> nn.Module:
    """Replace every plain nn.Linear in `model` (in place) by Int8Linear / Int4Linear; returns model.

    A LM head tied to the embedding is quantized from a copy: the embedding keeps
    its float weight and the tie is simply dropped. `act_dtype` is the dtype the
    kernels run in (bf16 is the only fast one on CPU and the only one tinygemm takes).
    """
    check_weight_mode(mode, group_size)
    if mode == "native":
        return model
    targets = [
        (name, m)
        for name, m in model.named_modules()
        if type(m) is nn.Linear and (include_lm_head or not _is_lm_head(name))
    ]
    for name, linear in targets:
        if mode == "int8":
            q = Int8Linear.from_linear(linear, act_dtype)
        else:
            q = Int4Linear.from_linear(linear, group_size, act_dtype)
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, child, q)
    return model


def quantized_linears(model: nn.Module) -> dict[str, nn.Module]:
    """name -> Int8Linear | Int4Linear, for reports and tests."""
    return {n: m for n, m in model.named_modules() if isinstance(m, (Int8Linear, Int4Linear))}


# ---------------------------------------------------------------------------- GGUF 4-bit blocks -> int4 parts


def int4_parts_from_gguf(raw: np.ndarray | bytes, qtype: str, shape: tuple[int, int]) -> Int4Parts:
    """GGUF Q4_0 / Q4_1 tensor data -> exact int4 g32 parts; shape = (out, in) in torch order.

    Block (32 weights): Q4_1 = f16 d, f16 m, 16 bytes of nibbles, w = q*d + m;
    Q4_0 = f16 d, 16 bytes, w = (q-8)*d. Nibbles: byte j holds weight j (low) and
    j+16 (high). In tinygemm terms scale = d and zero = m + 8d (Q4_0: zero = 0).
    """
    n, k = shape
    if k % _QK4:
        raise ValueError(f"GGUF 4-bit rows must be a multiple of {_QK4} long, got {k}")
    head = {"Q4_0": 2, "Q4_1": 4}.get(qtype.upper())
    if head is None:
        raise ValueError(f"int4 parts come from Q4_0 or Q4_1 tensors, not {qtype}")
    b = torch.from_numpy(np.frombuffer(raw, dtype=np.uint8).copy()).view(n, k // _QK4, head + 16)
    d = b[..., 0:2].contiguous().view(torch.float16).squeeze(-1).float()  # [n, k/32]
    qs = b[..., head:]
    q = torch.cat((qs & 15, qs >> 4), dim=-1).reshape(n, k)  # per block: low nibbles 0..15, then high 16..31
    if head == 4:
        m = b[..., 2:4].contiguous().view(torch.float16).squeeze(-1).float()
        zero = m + 8.0 * d
    else:
        zero = torch.zeros_like(d)
    return Int4Parts(q.contiguous(), d, zero, _QK4)


def int4_linear_from_gguf(
    raw: np.ndarray | bytes,
    qtype: str,
    shape: tuple[int, int],
    bias: torch.Tensor | None = None,
    act_dtype: torch.dtype = torch.bfloat16,
    device: torch.device | str = "cpu",
) -> Int4Linear:
    """One GGUF Q4_0/Q4_1 tensor -> Int4Linear (g32). Exact with act_dtype=float32; bf16 rounds d and m+8d."""
    parts = int4_parts_from_gguf(raw, qtype, shape)
    return Int4Linear.from_parts(parts, bias, act_dtype, device)
