"""The prefix cache: RAM-tier policy and SSD tier, wired under one block manager + KV pool.

The block manager keeps finished requests' blocks resident (the RAM tier);
this object gives it the byte budget, and moves bytes for it through the
`CacheTier` hooks:

- on publish (write-through): copy the new blocks' rows out of the pool on the
  engine thread (one gather per layer, no disk I/O) and queue them for the
  SSD writer thread;
- on evict (persist-before-evict): a block not yet on disk or in the queue is
  copied and queued before its slot is reused;
- at admission: a RAM miss that the SSD holds is read, checksum-verified and
  copied into freshly allocated blocks, which then count as cached;
- copy-on-write: a partial-block hit copies the matching rows into the
  request's own block.

A speculative drafter with its own pool gets its own PrefixCache over the
same SSD store, under a companion namespace (`CacheNamespace.companion`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from augury.cache.ssd_store import SSDStore
from augury.kv.block_manager import BlockManager, Tokens
from augury.kv.pool import KVPool


@dataclass
class PrefixCacheStats:
    ram_cached_blocks: int
    ram_cached_bytes: int
    ram_budget_bytes: int | None
    ram_evicted_blocks: int
    hit_tokens: int
    partial_hit_tokens: int
    ssd_restored_blocks: int
    ssd: dict | None


class PrefixCache:
    def __init__(self, blocks: BlockManager, pool: KVPool, store: SSDStore | None = None,
                 ram_budget_bytes: int | None = None, persist_before_evict: bool = True,
                 write_through: bool = True):
        self.blocks = blocks
        self.pool = pool
        self.store = store
        self.persist_before_evict = persist_before_evict
        self.write_through = write_through
        self.ram_budget_bytes = ram_budget_bytes
        self.layers: dict[str, list[int]] = {name: [i for i, g in enumerate(pool.group_of_layer) if g == name]
                                             for name in blocks.groups}
        # per (group, storage class): a block's bytes and how they map onto the pool
        self.block_bytes: dict[tuple[str, str], int] = {}
        self.layout: dict[tuple[str, str], str] = {}
        for name, ls in self.layers.items():
            for cls in blocks.class_names():
                self.block_bytes[name, cls] = sum(_row_bytes(t) for t in self._slot_tensors(ls, cls)) * pool.block_size
                self.layout[name, cls] = _layout(self._slot_tensors(ls[:1], cls), len(ls), pool.block_size)
        self.companions: dict[str, "PrefixCache"] = {}  # drafters' caches over the same store
        blocks.attach_tier(self)
        self.set_ram_budget(ram_budget_bytes)

    # ---- RAM tier policy -------------------------------------------------------
    def set_ram_budget(self, nbytes: int | None) -> None:
        """Most bytes of unreferenced cached blocks kept in the pool, split over groups
        in proportion to their per-block size (None: bounded by the pool only)."""
        self.ram_budget_bytes = nbytes
        counts = {(g, c): hi - lo for g in self.layers for c, lo, hi in self.blocks.pools[g].ranges}
        total = sum(self.block_bytes[gc] * n for gc, n in counts.items()) or 1
        for (name, cls), n in counts.items():
            if nbytes is None:
                self.blocks.set_cache_limit(name, None, cls)
            else:
                share = nbytes * self.block_bytes[name, cls] * n / total
                self.blocks.set_cache_limit(name, int(share // max(1, self.block_bytes[name, cls])), cls)

    def ram_cached_bytes(self) -> int:
        return sum(len(self.blocks.pools[g].evictable[c]) * nb for (g, c), nb in self.block_bytes.items())

    def group_block_bytes(self, group: str) -> int:
        """Bytes of one block of `group` in its first storage class."""
        return self.block_bytes[group, self.blocks.class_names()[0]]

    # ---- row movement ------------------------------------------------------------------
    def _slot_tensors(self, layers: list[int], cls: str) -> list[torch.Tensor]:
        """Every [num_slots, ...] tensor of storage class `cls` behind these layers, K then V
        per layer (a codec's store contributes each of its parts: codes, scales, ...)."""
        out: list[torch.Tensor] = []
        for layer in layers:
            out.extend(self.pool.class_tensors(layer, cls))
        return out

    def _local(self, group: str, block: int) -> tuple[str, int]:
        """(storage class, block index within that class's tensors)."""
        pool = self.blocks.pools[group]
        cls = pool.cls_of(block)
        lo = next(lo for c, lo, _ in pool.ranges if c == cls)
        return cls, block - lo

    def _blocks_view(self, t: torch.Tensor) -> torch.Tensor:
        """[num_slots, *rest] → [num_blocks, bs, *rest]."""
        return t.view(-1, self.pool.block_size, *t.shape[1:])

    def gather(self, group: str, block_ids: list[int]) -> list[torch.Tensor]:
        """Private CPU copies of blocks' bytes, one [block_bytes] uint8 row per block (one
        gather per tensor and storage class)."""
        by_cls: dict[str, list[int]] = {}
        for j, b in enumerate(block_ids):
            by_cls.setdefault(self._local(group, b)[0], []).append(j)
        out: list[torch.Tensor] = [torch.empty(0)] * len(block_ids)
        for cls, js in by_cls.items():
            idx = torch.tensor([self._local(group, block_ids[j])[1] for j in js], dtype=torch.long,
                               device=self._device())
            parts = [self._blocks_view(t).index_select(0, idx).reshape(len(js), -1).view(torch.uint8)
                     for t in self._slot_tensors(self.layers[group], cls)]
            rows = torch.cat(parts, dim=1)  # a fresh tensor: safe from slot reuse
            rows = rows.cpu() if rows.device.type != "cpu" else rows
            for r, j in enumerate(js):
                out[j] = rows[r]
        return out

    def scatter(self, group: str, block: int, payload: torch.Tensor) -> None:
        """payload [block_bytes] uint8 → pool block `block`."""
        off = 0
        payload = payload.to(self._device())
        cls, local = self._local(group, block)
        for t in self._slot_tensors(self.layers[group], cls):
            dst = self._blocks_view(t)[local]
            nb = dst.numel() * dst.element_size()
            dst.copy_(payload[off:off + nb].view(t.dtype).view(dst.shape))
            off += nb

    def _device(self) -> torch.device:
        return self.pool.device

    # ---- CacheTier hooks (engine thread) ---------------------------------------------------
    def has(self, namespace: str, group: str, h: bytes) -> bool:
        return self.store is not None and self.store.contains(namespace, group, h)

    def restore(self, namespace: str, group: str, h: bytes, block: int) -> bool:
        if self.store is None:
            return False
        cls = self._local(group, block)[0]
        payload = self.store.get(namespace, group, h, self.layout[group, cls])
        if payload is None or payload.numel() != self.block_bytes[group, cls]:
            return False
        self.scatter(group, block, payload.view(torch.uint8).reshape(-1))
        return True

    def on_publish(self, namespace: str, group: str, items: list[tuple[int, bytes, Tokens]]) -> None:
        if self.store is None or not self.write_through:
            return
        todo = [it for it in items if not self.store.contains(namespace, group, it[1])]
        if not todo:
            return
        rows = self.gather(group, [b for b, _, _ in todo])
        for j, (b, h, toks) in enumerate(todo):
            self.store.put(namespace, group, h, toks, rows[j], self.layout[group, self._local(group, b)[0]])

    def on_evict(self, namespace: str, group: str, block: int, h: bytes, tokens: Tokens) -> None:
        if self.store is None or not self.persist_before_evict or self.store.contains(namespace, group, h):
            return
        self.store.put(namespace, group, h, tokens, self.gather(group, [block])[0],
                       self.layout[group, self._local(group, block)[0]], force=True)

    def copy_rows(self, group: str, src: int, dst: int, num_rows: int) -> None:
        cls, s = self._local(group, src)
        cls_d, d = self._local(group, dst)
        assert cls == cls_d, "copy-on-write within one storage class"
        for t in self._slot_tensors(self.layers[group], cls):
            bv = self._blocks_view(t)
            bv[d, :num_rows].copy_(bv[s, :num_rows])

    def flush(self, timeout: float | None = None) -> bool:
        """Wait for queued SSD writes (True when none is left)."""
        return self.store.flush(timeout) if self.store is not None else True

    def close(self) -> None:
        if self.store is not None:
            self.store.close(flush=True)

    # ---- admin ---------------------------------------------------------------------------
    def stats(self) -> PrefixCacheStats:
        b = self.blocks
        return PrefixCacheStats(
            ram_cached_blocks=b.num_cached_blocks(), ram_cached_bytes=self.ram_cached_bytes(),
            ram_budget_bytes=self.ram_budget_bytes, ram_evicted_blocks=b.num_evicted_blocks(),
            hit_tokens=b.prefix_hit_tokens, partial_hit_tokens=b.partial_hit_tokens,
            ssd_restored_blocks=b.restored_blocks,
            ssd=self.store.stats().as_dict() if self.store is not None else None)


def _row_bytes(t: torch.Tensor) -> int:
    """Bytes of one slot of a [num_slots, ...] tensor."""
    return (t.numel() // max(1, t.shape[0])) * t.element_size()


def _layout(per_layer: list[torch.Tensor], num_layers: int, block_size: int) -> str:
    """How a block's bytes map onto the pool: block size, layer count, then each K/V
    part's dtype and per-slot shape."""
    parts = ",".join(f"{str(t.dtype).removeprefix('torch.')}{list(t.shape[1:])}" for t in per_layer)
    return f"bs{block_size}:{num_layers}x[{parts}]"
