"""One-query-per-request attention for eager CPU decode steps (see layers/attention.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import torch

if TYPE_CHECKING:
    from augury.layers.attention import GroupAttnMeta

Reader = Callable[[torch.Tensor], torch.Tensor]  # flat slots [S] -> rows [S, Hkv, D]


def attend_decode_cpu(q: torch.Tensor, read_k: Reader, read_v: Reader, gmeta: "GroupAttnMeta",
                      scale: float) -> torch.Tensor:
    """One query per request, q [B, H, D] -> [B, H, D] (CPU; GPUs keep SDPA's decode kernels).

    Two batched matmuls and a softmax, with the query heads grouped under their KV head
    (GQA without repeating K/V): for one row SDPA's kernel setup costs more than the math."""
    B, H, D = q.shape
    flat = gmeta.gather_slots.view(-1)
    kc = read_k(flat)  # [B * max_kv, Hkv, D]
    vc = read_v(flat)
    Hkv = kc.shape[1]
    if kc.dtype != q.dtype:
        kc, vc = kc.to(q.dtype), vc.to(q.dtype)
    kc = kc.view(B, -1, Hkv, D).permute(0, 2, 3, 1)  # [B, Hkv, D, max_kv]
    vc = vc.view(B, -1, Hkv, D).transpose(1, 2)  # [B, Hkv, max_kv, D]
    # HF repeat_kv order: query head h reads KV head h // (H // Hkv)
    s = torch.matmul(q.view(B, Hkv, H // Hkv, D), kc).mul_(scale)  # [B, Hkv, rep, max_kv]
    if not gmeta.dense:
        s.add_(gmeta.additive_mask(q.dtype))  # [B, 1, 1, max_kv] broadcasts over heads
    p = torch.softmax(s, dim=-1) if s.dtype == torch.float32 else torch.softmax(s, -1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(p, vc).view(B, H, D)
