"""Paged attention over encoded KV: encode on write, dequantize-on-read.

Same contract as `augury.layers.attention.paged_attention`, reached through
its branch when the pool holds `EncodedStore`s instead of tensors; the
attention itself is the shared `attend` with the stores as slot readers.
Rotated keys: queries are rotated once per row, so q·k needs no key un-rotation.
Rotated values: attention returns R·o, un-rotated once per query row.
"""

from __future__ import annotations

import torch

from augury.kv.codecs.store import EncodedStore


def encoded_paged_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_store: EncodedStore,
    v_store: EncodedStore,
    gmeta,
    scale: float,
    softcap: float | None,
) -> torch.Tensor:
    """q [T, H, D], k/v [T, Hkv, D] (rope applied) -> [T, H, D]. `gmeta` is a GroupAttnMeta."""
    from augury.layers.attention import attend  # layers.attention imports this module lazily

    k_store.write(gmeta.slot_mapping, k)
    v_store.write(gmeta.slot_mapping, v)
    if k_store.rotation is not None:
        q = k_store.rotation.rotate(q)
    o = attend(q, k_store.read, v_store.read, gmeta, scale, softcap)  # [T, H, D]
    if v_store.rotation is not None:
        o = v_store.rotation.unrotate(o)  # deferred: one [D, D] product per query row
    return o
