"""Paged KV block manager: block ids, ref counts, prefix hashes, trim.

Pure bookkeeping (no torch): it decides which slots of the KV pool each
request owns; the pool tensors live in `kv/pool.py`.

A model may have several KV *groups* (gemma3: "full" layers and "sliding"
layers). Each group has its own pool of blocks and each request one block
table per group, so sliding-window layers can release blocks that left the
window while full-attention layers keep theirs.

Prefix sharing: every full block of confirmed tokens gets a chained hash
h_i = H(h_{i-1}, tokens of block i) seeded by a namespace. Blocks whose last
owner finished stay resident, keyed by that hash, until their slot is needed
(evicted least recently released first; a finished request releases its
tail first so ancestors outlive descendants).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

NULL_BLOCK = -1  # a released sliding-window block in a table


@dataclass(frozen=True)
class KVGroup:
    name: str
    num_blocks: int
    window: int | None = None  # sliding window (tokens) or None for full attention


def chain_hashes(token_ids: Sequence[int], block_size: int, namespace: str, start: bytes | None = None,
                 start_block: int = 0, prev: list[bytes] | None = None) -> list[bytes]:
    """Hashes of every full block of `token_ids`; block i's hash covers blocks 0..i."""
    out = list(prev or [])
    h = out[-1] if out else (start or hashlib.blake2b(namespace.encode(), digest_size=16).digest())
    n_full = len(token_ids) // block_size
    arr = np.asarray(token_ids[: n_full * block_size], dtype=np.int64)
    for i in range(len(out), n_full):
        h = hashlib.blake2b(h + arr[i * block_size:(i + 1) * block_size].tobytes(), digest_size=16).digest()
        out.append(h)
    return out


class _GroupPool:
    """Free list + ref counts + hash index for one group's blocks."""

    def __init__(self, group: KVGroup):
        self.group = group
        self.ref = [0] * group.num_blocks
        self.hash_of: list[bytes | None] = [None] * group.num_blocks
        self.free_plain: list[int] = list(range(group.num_blocks - 1, -1, -1))  # pop() from the end
        self.evictable: OrderedDict[int, None] = OrderedDict()  # ref 0 but hashed; oldest first
        self.cached: dict[bytes, int] = {}

    @property
    def num_free(self) -> int:
        return len(self.free_plain) + len(self.evictable)

    def take_free(self) -> int:
        if self.free_plain:
            b = self.free_plain.pop()
        else:
            b, _ = self.evictable.popitem(last=False)
            h = self.hash_of[b]
            if h is not None and self.cached.get(h) == b:
                del self.cached[h]
            self.hash_of[b] = None
        self.ref[b] = 1
        return b

    def take_cached(self, b: int) -> None:
        if self.ref[b] == 0:
            self.evictable.pop(b, None)
        self.ref[b] += 1

    def release(self, b: int) -> None:
        self.ref[b] -= 1
        assert self.ref[b] >= 0, "block released twice"
        if self.ref[b] == 0:
            if self.hash_of[b] is not None and self.cached.get(self.hash_of[b]) == b:
                self.evictable[b] = None
            else:
                self.hash_of[b] = None
                self.free_plain.append(b)

    def publish(self, b: int, h: bytes) -> None:
        if self.hash_of[b] is None and h not in self.cached:
            self.hash_of[b] = h
            self.cached[h] = b


@dataclass
class _ReqBlocks:
    tables: dict[str, list[int]]
    hashes: list[bytes] = field(default_factory=list)
    num_published: int = 0  # blocks whose hash was published


class BlockManager:
    def __init__(self, groups: Sequence[KVGroup], block_size: int, enable_prefix_caching: bool = True):
        if not groups:
            raise ValueError("at least one KV group")
        self.block_size = block_size
        self.groups = {g.name: g for g in groups}
        self.pools = {g.name: _GroupPool(g) for g in groups}
        self.enable_prefix_caching = enable_prefix_caching
        self.reqs: dict[str, _ReqBlocks] = {}
        self.prefix_hit_tokens = 0  # counter: tokens served from shared blocks

    # ---- queries -------------------------------------------------------
    def num_free_blocks(self, group: str | None = None) -> int:
        if group is not None:
            return self.pools[group].num_free
        return sum(p.num_free for p in self.pools.values())

    def num_total_blocks(self) -> int:
        return sum(g.num_blocks for g in self.groups.values())

    def block_tables(self, req_id: str) -> dict[str, list[int]]:
        return self.reqs[req_id].tables

    def has(self, req_id: str) -> bool:
        return req_id in self.reqs

    def _blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def _first_needed_block(self, group: KVGroup, next_pos: int) -> int:
        """First block a query at position >= next_pos can still attend to."""
        if group.window is None:
            return 0
        return max(0, next_pos - group.window + 1) // self.block_size

    # ---- prefix match --------------------------------------------------
    def _match(self, hashes: list[bytes], max_blocks: int) -> int:
        """Longest k <= max_blocks such that every group can serve a k-block prefix."""
        full = [g for g in self.groups.values() if g.window is None]
        k = 0
        for i in range(min(len(hashes), max_blocks)):
            if all(hashes[i] in self.pools[g.name].cached for g in full):
                k = i + 1
            else:
                break
        while k > 0:
            ok = True
            for g in self.groups.values():
                if g.window is None:
                    continue
                lo = self._first_needed_block(g, k * self.block_size)
                if not all(hashes[i] in self.pools[g.name].cached for i in range(lo, k)):
                    ok = False
                    break
            if ok:
                return k
            k -= 1
        return 0

    # ---- allocation ----------------------------------------------------
    def admit(self, req_id: str, token_ids: Sequence[int], max_new: int, namespace: str = "") -> tuple[int, int] | None:
        """Start a request: reuse its longest cached prefix, then allocate blocks for
        up to `max_new` more tokens after it. Returns (cached tokens, new tokens), or
        None (nothing changed) when the pool cannot hold it now.

        At least one token is always left to compute, so the step yields logits.
        """
        assert req_id not in self.reqs
        bs = self.block_size
        hashes = chain_hashes(token_ids, bs, namespace) if self.enable_prefix_caching else []
        k = self._match(hashes, (len(token_ids) - 1) // bs) if hashes else 0
        cached = k * bs
        num_new = min(len(token_ids) - cached, max_new)
        total = cached + num_new
        plan: dict[str, list[int]] = {}
        for name, g in self.groups.items():
            lo = self._first_needed_block(g, cached)
            hit = [self.pools[name].cached[hashes[i]] for i in range(lo, k)]
            need = self._blocks_for(total) - k
            # hit blocks sitting in the evictable list stop being free once taken
            reclaim = sum(1 for b in hit if self.pools[name].ref[b] == 0)
            if need > self.pools[name].num_free - reclaim:
                return None
            plan[name] = hit
        tables: dict[str, list[int]] = {}
        for name, g in self.groups.items():
            pool = self.pools[name]
            lo = self._first_needed_block(g, cached)
            for b in plan[name]:
                pool.take_cached(b)
            t = [NULL_BLOCK] * lo + plan[name]
            t += [pool.take_free() for _ in range(self._blocks_for(total) - k)]
            tables[name] = t
        self.reqs[req_id] = _ReqBlocks(tables=tables, hashes=hashes[:k], num_published=k)
        self.prefix_hit_tokens += cached
        return cached, num_new

    def can_grow(self, req_id: str, num_tokens: int) -> bool:
        r = self.reqs[req_id]
        need = self._blocks_for(num_tokens)
        return all(need - len(r.tables[n]) <= self.pools[n].num_free for n in self.groups)

    def grow(self, req_id: str, num_tokens: int) -> bool:
        """Make the tables cover positions [0, num_tokens). All or nothing."""
        if not self.can_grow(req_id, num_tokens):
            return False
        r = self.reqs[req_id]
        need = self._blocks_for(num_tokens)
        for n in self.groups:
            t = r.tables[n]
            while len(t) < need:
                t.append(self.pools[n].take_free())
        return True

    def trim(self, req_id: str, num_tokens: int) -> None:
        """Drop blocks past `num_tokens` (rejected draft tokens)."""
        r = self.reqs[req_id]
        keep = self._blocks_for(num_tokens)
        assert keep >= r.num_published, "cannot trim published (confirmed) blocks"
        for n in self.groups:
            t = r.tables[n]
            while len(t) > keep:
                b = t.pop()
                if b != NULL_BLOCK:
                    self.pools[n].release(b)

    def commit(self, req_id: str, token_ids: Sequence[int], num_confirmed: int, namespace: str = "") -> None:
        """`token_ids[:num_confirmed]` now have their KV written and are final:
        publish full blocks for prefix sharing, release sliding blocks out of window."""
        r = self.reqs[req_id]
        bs = self.block_size
        if self.enable_prefix_caching:
            n_full = num_confirmed // bs
            if n_full > len(r.hashes):
                r.hashes = chain_hashes(token_ids[: n_full * bs], bs, namespace, prev=r.hashes)
            for i in range(r.num_published, n_full):
                for n in self.groups:
                    b = r.tables[n][i]
                    if b != NULL_BLOCK:
                        self.pools[n].publish(b, r.hashes[i])
            r.num_published = max(r.num_published, n_full)
        for n, g in self.groups.items():
            if g.window is None:
                continue
            t = r.tables[n]
            lo = min(self._first_needed_block(g, num_confirmed), len(t))
            for i in range(lo):
                if t[i] != NULL_BLOCK:
                    self.pools[n].release(t[i])
                    t[i] = NULL_BLOCK

    def free(self, req_id: str) -> None:
        """Release every block of a request (tail first, so ancestors are evicted last)."""
        r = self.reqs.pop(req_id, None)
        if r is None:
            return
        for n in self.groups:
            for b in reversed(r.tables[n]):
                if b != NULL_BLOCK:
                    self.pools[n].release(b)

    def reset_prefix_cache(self) -> None:
        for pool in self.pools.values():
            while pool.evictable:
                b, _ = pool.evictable.popitem(last=False)
                pool.cached.pop(pool.hash_of[b], None)
                pool.hash_of[b] = None
                pool.free_plain.append(b)
