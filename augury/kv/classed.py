"""KV storage with several classes per layer: requests with different codecs in one pool.

A pool normally stores one codec per layer (a tensor, or an `EncodedStore`).
When it serves several codecs (per-request `kv_cache`, delayed conversion with
`start = N`), each layer holds one store per *storage class* (see the block
manager's `KVGroup.classes`): class c owns pool slots [offset_c, offset_c + n_c)
of the group's slot space, and its store is indexed by local slot.

Attention (`classed_paged_attention`) runs per segment of the step:
- a segment whose requests touch one class gets slots already translated to
  that class's local ids (in `build_attention_metadata`) and runs the usual
  path on that class's store: the fused Triton kernels, CUDA or not;
- a segment that spans classes (a request past its `start` boundary, reading
  native blocks and encoded ones) reads through `MixedView`: every class is
  decoded in the encoded class's basis (native rows are rotated once when the
  codec rotates) and the right one is picked per slot; writes go to each
  class by the host-computed split.
"""

from __future__ import annotations

import torch

from augury.kv.codecs.store import EncodedStore

Store = torch.Tensor | EncodedStore


def _num_slots(store: Store) -> int:
    return store.shape[0] if isinstance(store, torch.Tensor) else store.num_slots


class ClassedStore:
    """One side (K or V) of one layer: `stores[cls] = (store, first global slot)`."""

    def __init__(self, stores: dict[str, tuple[Store, int]]):
        self.stores = stores

    def store(self, cls: str) -> Store:
        return self.stores[cls][0]

    def tensors(self, cls: str) -> list[torch.Tensor]:
        """The class's [num_slots, ...] tensors (an encoded store's parts)."""
        s = self.stores[cls][0]
        return [s] if isinstance(s, torch.Tensor) else list(s.parts)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for c in self.stores for t in self.tensors(c))

    @property
    def device(self) -> torch.device:
        return self.tensors(next(iter(self.stores)))[0].device


class MixedView:
    """A segment's reader/writer over several classes (the `EncodedStore` interface that
    `encoded_paged_attention` uses): reads come back in the encoded class's basis."""

    fused = False  # the Triton kernels read one store; a mixed segment decodes on read

    def __init__(self, classed: ClassedStore, classes: tuple[str, ...],
                 write_split: list[tuple[str, torch.Tensor, torch.Tensor]]):
        self.classed = classed
        self.classes = classes
        self.write_split = write_split
        rotations = [s.rotation for c in classes
                     if isinstance(s := classed.store(c), EncodedStore) and s.rotation is not None]
        self.rotation = rotations[0] if rotations else None
        if len(rotations) > 1:
            raise ValueError("a mixed KV segment can hold one rotated codec only")

    def write(self, slots: torch.Tensor, x: torch.Tensor) -> None:
        """x [T, Hkv, D]: token rows go to their class (split computed on the host)."""
        for cls, tok, local in self.write_split:
            s = self.classed.store(cls)
            rows = x.index_select(0, tok)
            if isinstance(s, torch.Tensor):
                s.index_copy_(0, local, rows.to(s.dtype))
            else:
                s.write(local, rows)

    def read(self, slots: torch.Tensor) -> torch.Tensor:
        """Global slots [S] -> rows [S, Hkv, D]: each class decodes every slot (clamped) and
        the owner's rows are kept: no host sync, at the cost of one extra read per class."""
        out = None
        for cls in self.classes:
            s, off = self.classed.stores[cls]
            n = _num_slots(s)
            local = (slots - off).clamp_(0, n - 1)
            if isinstance(s, torch.Tensor):
                rows = s.index_select(0, local)
                if self.rotation is not None:
                    rows = self.rotation.rotate(rows)
            else:
                rows = s.read(local)
            if out is None:
                out = rows
            else:
                mine = ((slots >= off) & (slots < off + n))[:, None, None]
                out = torch.where(mine, rows.to(out.dtype), out)
        assert out is not None
        return out


def classed_paged_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_store: ClassedStore,
                            v_store: ClassedStore, gmeta, scale: float, softcap: float | None) -> torch.Tensor:
    """`paged_attention` over a classed pool: per codec run, per decode/window segment."""
    if gmeta.codec_parts is not None:
        return torch.cat([_run(q[lo:hi], k[lo:hi], v[lo:hi], k_store, v_store, sub, scale, softcap)
                          for lo, hi, sub, _ in gmeta.codec_parts])
    return _run(q, k, v, k_store, v_store, gmeta, scale, softcap)


def _run(q, k, v, k_store, v_store, gm, scale, softcap) -> torch.Tensor:
    if gm.parts is None:
        return _segment(q, k, v, k_store, v_store, gm, scale, softcap)
    return torch.cat([_segment(q[lo:hi], k[lo:hi], v[lo:hi], k_store, v_store, part, scale, softcap)
                      for lo, hi, part in gm.parts])


def _segment(q, k, v, k_store: ClassedStore, v_store: ClassedStore, gm, scale, softcap) -> torch.Tensor:
    from augury.kv.codecs.attention import encoded_paged_attention
    from augury.layers.attention import paged_attention

    if gm.store_class is not None:  # slots are local to that class's store
        return paged_attention(q, k, v, k_store.store(gm.store_class), v_store.store(gm.store_class), gm,
                               scale, softcap)
    if gm.write_split is None:
        raise ValueError("a pool with several KV codecs needs attention metadata built with its class ranges "
                         "(build_attention_metadata(..., class_ranges=pool.class_ranges))")
    kv = MixedView(k_store, gm.view_classes, gm.write_split)
    vv = MixedView(v_store, gm.view_classes, gm.write_split)
    return encoded_paged_attention(q, k, v, kv, vv, gm, scale, softcap)
