"""Paged attention over encoded KV: encode on write, dequantize-on-read.

Same contract as `augury.layers.attention.paged_attention`, reached through
its branch when the pool holds `EncodedStore`s instead of tensors. Rotated
keys: queries are rotated once per row, so q·k needs no key un-rotation.
Rotated values: attention returns R·o; it is un-rotated once per query row.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

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
    from augury.layers.attention import softcap_attention

    k_store.write(gmeta.slot_mapping, k)
    v_store.write(gmeta.slot_mapping, v)
    T, H, D = q.shape
    B, max_q = gmeta.num_seqs, gmeta.max_q
    if gmeta.q_index is None:
        qp = q.reshape(B, max_q, H, D)
    else:
        qp = q.index_select(0, gmeta.q_index).view(B, max_q, H, D)
    if k_store.rotation is not None:
        qp = k_store.rotation.rotate(qp)
    qp = qp.transpose(1, 2)  # [B, H, max_q, D]
    kc = k_store.read(gmeta.gather_slots).to(q.dtype).transpose(1, 2)  # [B, Hkv, max_kv, D]
    vc = v_store.read(gmeta.gather_slots).to(q.dtype).transpose(1, 2)
    if softcap is None:
        o = F.scaled_dot_product_attention(
            qp, kc, vc, attn_mask=gmeta.additive_mask(q.dtype), scale=scale, enable_gqa=kc.shape[1] != H
        )
    else:
        o = softcap_attention(qp, kc, vc, gmeta.mask, scale, softcap)
    o = o.transpose(1, 2)  # [B, max_q, H, D]
    if v_store.rotation is not None:
        o = v_store.rotation.unrotate(o)  # deferred: one [D, D] product per query row
    if gmeta.out_index is None:
        return o.reshape(T, H, D)
    return o.reshape(B * max_q, H, D).index_select(0, gmeta.out_index)
