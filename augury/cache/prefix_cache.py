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
        self.block_bytes = {name: sum(_row_bytes(t) for t in self._slot_tensors(ls)) * pool.block_size
                            for name, ls in self.layers.items()}
        self.layout = {name: _layout(self._slot_tensors(ls[:1]), len(ls), pool.block_size) for name, ls in self.layers.items()}
        self.companions: dict[str, "PrefixCache"] = {}  # drafters' caches over the same store
        blocks.attach_tier(self)
        self.set_ram_budget(ram_budget_bytes)

    # ---- RAM tier policy -------------------------------------------------------
    def set_ram_budget(self, nbytes: int | None) -> None:
        """Most bytes of unreferenced cached blocks kept in the pool, split over groups
        in proportion to their per-block size (None: bounded by the pool only)."""
        self.ram_budget_bytes = nbytes
        total = sum(self.block_bytes[n] * self.blocks.groups[n].num_blocks for n in self.layers) or 1
        for name in self.layers:
            if nbytes is None:
                self.blocks.set_cache_limit(name, None)
            else:
                share = nbytes * self.block_bytes[name] * self.blocks.groups[name].num_blocks / total
                self.blocks.set_cache_limit(name, int(share // max(1, self.block_bytes[name])))

    def ram_cached_bytes(self) -> int:
        return sum(self.blocks.num_cached_blocks(n) * self.block_bytes[n] for n in self.layers)

    # ---- row movement ------------------------------------------------------------------
    def _slot_tensors(self, layers: list[int]) -> list[torch.Tensor]:
        """Every [num_slots, ...] tensor behind these layers, K then V per layer (a
        codec's store contributes each of its parts: codes, scales, ...)."""
        out: list[torch.Tensor] = []
        for layer in layers:
            for side in (self.pool.k[layer], self.pool.v[layer]):
                out.extend(side.parts if hasattr(side, "parts") else [side])
        return out

    def _blocks_view(self, t: torch.Tensor) -> torch.Tensor:
        """[num_slots, *rest] → [num_blocks, bs, *rest]."""
        return t.view(-1, self.pool.block_size, *t.shape[1:])

    def gather(self, group: str, block_ids: list[int]) -> torch.Tensor:
        """A private CPU copy of blocks' bytes: [n, block_bytes] uint8 (one gather per tensor)."""
        dev = self.pool.k[0].device if isinstance(self.pool.k[0], torch.Tensor) else self.pool.k[0].parts[0].device
        idx = torch.tensor(block_ids, dtype=torch.long, device=dev)
        n = len(block_ids)
        parts = [self._blocks_view(t).index_select(0, idx).reshape(n, -1).view(torch.uint8)
                 for t in self._slot_tensors(self.layers[group])]
        out = torch.cat(parts, dim=1)  # a fresh tensor: safe from slot reuse
        return out.cpu() if out.device.type != "cpu" else out

    def scatter(self, group: str, block: int, payload: torch.Tensor) -> None:
        """payload [block_bytes] uint8 → pool block `block`."""
        off = 0
        payload = payload.to(self._device())
        for t in self._slot_tensors(self.layers[group]):
            dst = self._blocks_view(t)[block]
            nb = dst.numel() * dst.element_size()
            dst.copy_(payload[off:off + nb].view(t.dtype).view(dst.shape))
            off += nb

    def _device(self) -> torch.device:
        k0 = self.pool.k[0]
        return k0.device if isinstance(k0, torch.Tensor) else k0.parts[0].device

    # ---- CacheTier hooks (engine thread) ---------------------------------------------------
    def has(self, namespace: str, group: str, h: bytes) -> bool:
        return self.store is not None and self.store.contains(namespace, group, h)

    def restore(self, namespace: str, group: str, h: bytes, block: int) -> bool:
        if self.store is None:
            return False
        payload = self.store.get(namespace, group, h, self.layout[group])
        if payload is None or payload.numel() != self.block_bytes[group]:
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
        for j, (_, h, toks) in enumerate(todo):
            self.store.put(namespace, group, h, toks, rows[j], self.layout[group])

    def on_evict(self, namespace: str, group: str, block: int, h: bytes, tokens: Tokens) -> None:
        if self.store is None or not self.persist_before_evict or self.store.contains(namespace, group, h):
            return
        self.store.put(namespace, group, h, tokens, self.gather(group, [block])[0], self.layout[group], force=True)

    def copy_rows(self, group: str, src: int, dst: int, num_rows: int) -> None:
        for t in self._slot_tensors(self.layers[group]):
            bv = self._blocks_view(t)
            bv[dst, :num_rows].copy_(bv[src, :num_rows])

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
