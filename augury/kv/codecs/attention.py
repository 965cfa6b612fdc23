"""Paged attention over encoded KV: encode on write; read fused or dequantize-on-read.

Same contract as `augury.layers.attention.paged_attention`, reached through
its branch when the pool holds `EncodedStore`s instead of tensors. On CUDA,
decode and verify steps read the codes directly with the Triton kernel
(`triton_attention`); elsewhere (CPU, prefill-wide steps, codecs the kernel
does not know) the shared `attend` runs with the stores as slot readers.
Rotated keys: queries are rotated once per row, so q·k needs no key un-rotation.
Rotated values: attention returns R·o, un-rotated once per query row.
"""

from __future__ import annotations

import functools

import torch

from augury.kv.codecs.store import EncodedStore


@functools.lru_cache(maxsize=1)
def _kernel_module():
    """The Triton kernel module, or None where triton cannot be imported."""
    try:
        from augury.kv.codecs import triton_attention
    except Exception:  # no triton, or a triton that cannot build here: the eager path serves
        return None
    return triton_attention


def fused_path_available(q: torch.Tensor, k_store: EncodedStore) -> bool:
    return q.is_cuda and k_store.fused and _kernel_module() is not None


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
    if fused_path_available(q, k_store):
        o = _fused_attend(q, k_store, v_store, gmeta, scale, softcap)
    else:
        o = attend(q, k_store.read, v_store.read, gmeta, scale, softcap)  # [T, H, D]
    if v_store.rotation is not None:
        o = v_store.rotation.unrotate(o)  # deferred: one [D, D] product per query row
    return o


def _fused_attend(q: torch.Tensor, k_store: EncodedStore, v_store: EncodedStore, gmeta, scale: float,
                  softcap: float | None) -> torch.Tensor:
    """Per segment of the step (see GroupAttnMeta.parts): the kernel where it takes the width."""
    if gmeta.parts is None:
        return _fused_segment(q, k_store, v_store, gmeta, scale, softcap)
    return torch.cat([_fused_segment(q[lo:hi], k_store, v_store, part, scale, softcap)
                      for lo, hi, part in gmeta.parts])


def _fused_segment(q: torch.Tensor, k_store: EncodedStore, v_store: EncodedStore, gm, scale: float,
                   softcap: float | None) -> torch.Tensor:
    from augury.layers.attention import attend

    kernels = _kernel_module()
    T, H, D = q.shape
    B, max_q = gm.num_seqs, gm.max_q
    if not kernels.fused_supported(k_store, v_store, max_q, H):
        return attend(q, k_store.read, v_store.read, gm, scale, softcap)
    qp = q.view(B, max_q, H, D) if gm.q_index is None else q.index_select(0, gm.q_index).view(B, max_q, H, D)
    # the additive mask is what CUDA graphs refill per replay (their bool mask is a placeholder)
    o = kernels.encoded_decode_attention(qp, k_store, v_store, gm.gather_slots, gm.additive_mask(q.dtype),
                                         scale, softcap)
    o = o.reshape(B * max_q, H, D)
    return o if gm.out_index is None else o.index_select(0, gm.out_index)
