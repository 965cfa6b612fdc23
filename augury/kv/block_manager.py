"""Paged KV block manager: block ids, ref counts, prefix hashes, trim.

Pure bookkeeping (no torch): it decides which slots of the KV pool each
request owns; the pool tensors live in `kv/pool.py`, and anything that moves
bytes (SSD restore, write-behind, copy-on-write) goes through the `CacheTier`
hooks that `augury/cache` attaches.

Storage classes: a group's blocks may be split into *classes* (contiguous id
ranges), one per KV codec the pool stores, so requests with different codecs
share one batch and a request with delayed conversion (`start = N`) keeps its
first blocks in the native class. A request's `BlockClasses` says which class
each of its blocks comes from; the class is part of every block hash, so a
cached block is only reused at the precision it was stored in.

A model may have several KV *groups* (gemma3: "full" layers and "sliding"
layers). Each group has its own pool of blocks and each request one block
table per group, so sliding-window layers can release blocks that left the
window while full-attention layers keep theirs.

Prefix sharing: every full block of confirmed tokens gets a chained hash
h_i = H(h_{i-1}, tokens of block i) seeded by a namespace. Blocks whose last
owner finished stay resident, keyed by that hash, until their slot is needed
or the RAM budget (`set_cache_limit`) is exceeded (evicted least recently
released first; a finished request releases its tail first so ancestors
outlive descendants). A finished request's last, partial block is kept too
(RAM only): a later prompt that matches its first m tokens gets a private copy
of those m rows (copy-on-write) instead of recomputing them.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable, Protocol, Sequence

import numpy as np

NULL_BLOCK = -1  # a released sliding-window block in a table

Tokens = tuple[int, ...]


@dataclass(frozen=True)
class KVGroup:
    name: str
    num_blocks: int
    window: int | None = None  # sliding window (tokens) or None for full attention
    # storage classes as (name, num_blocks), in block-id order; () = one unnamed class
    classes: tuple[tuple[str, int], ...] = ()

    def class_ranges(self) -> list[tuple[str, int, int]]:
        """(class, first block id, end block id) of each class."""
        out, lo = [], 0
        for name, n in self.classes or (("", self.num_blocks),):
            out.append((name, lo, lo + n))
            lo += n
        if lo != self.num_blocks:
            raise ValueError(f"group {self.name!r}: classes hold {lo} blocks, the group {self.num_blocks}")
        return out


@dataclass(frozen=True)
class BlockClasses:
    """The storage class of each block of a request: blocks before `boundary` are `low`
    (the native class under delayed conversion), the others `high`."""

    high: str = ""
    low: str = ""
    boundary: int = 0  # in blocks

    def of(self, i: int) -> str:
        return self.low if i < self.boundary else self.high

    def count(self, lo: int, hi: int) -> dict[str, int]:
        """How many of blocks [lo, hi) each class provides."""
        out: dict[str, int] = {}
        n_low = max(0, min(hi, self.boundary) - lo)
        if n_low:
            out[self.low] = n_low
        if hi - lo - n_low > 0:
            out[self.high] = out.get(self.high, 0) + hi - lo - n_low
        return out


def seed_hash(namespace: str) -> bytes:
    """The chain's h_{-1}: the namespace alone."""
    return hashlib.blake2b(namespace.encode(), digest_size=16).digest()


def chain_hashes(token_ids: Sequence[int], block_size: int, namespace: str, start: bytes | None = None,
                 start_block: int = 0, prev: list[bytes] | None = None,
                 classes: BlockClasses | None = None) -> list[bytes]:
    """Hashes of every full block of `token_ids`; block i's hash covers blocks 0..i and
    the storage class of block i (the unnamed class adds nothing)."""
    out = list(prev or [])
    h = out[-1] if out else (start or seed_hash(namespace))
    n_full = len(token_ids) // block_size
    arr = np.asarray(token_ids[: n_full * block_size], dtype=np.int64)
    for i in range(len(out), n_full):
        cls = classes.of(i).encode() if classes is not None else b""
        h = hashlib.blake2b(h + cls + arr[i * block_size:(i + 1) * block_size].tobytes(), digest_size=16).digest()
        out.append(h)
    return out


class CacheTier(Protocol):
    """What `augury/cache` plugs into the block manager (engine thread only)."""

    def has(self, namespace: str, group: str, h: bytes) -> bool:
        """A lower tier (SSD) holds this block."""

    def restore(self, namespace: str, group: str, h: bytes, block: int) -> bool:
        """Copy the lower tier's rows for `h` into pool block `block`; False if unusable."""

    def on_publish(self, namespace: str, group: str, items: list[tuple[int, bytes, Tokens]]) -> None:
        """Blocks (block id, hash, tokens) just became shareable: write-through point."""

    def on_evict(self, namespace: str, group: str, block: int, h: bytes, tokens: Tokens) -> None:
        """A cached block is about to lose its slot (persist-before-evict point)."""

    def copy_rows(self, group: str, src: int, dst: int, num_rows: int) -> None:
        """Copy the first `num_rows` token rows of block `src` into block `dst` (all layers)."""


@dataclass
class _Meta:
    """What a cached block holds: enough to re-key, re-parent and persist it."""

    h: bytes
    parent: bytes
    tokens: Tokens
    namespace: str
    partial: bool = False  # a finished request's last, incomplete block (RAM only)


class _GroupPool:
    """Free list + ref counts + hash index for one group's blocks."""

    def __init__(self, group: KVGroup):
        self.group = group
        self.ref = [0] * group.num_blocks
        self.hash_of: list[bytes | None] = [None] * group.num_blocks
        self.meta: list[_Meta | None] = [None] * group.num_blocks
        self.ranges = group.class_ranges()
        # per storage class: free ids (pop() from the end), ref-0 hashed blocks (oldest first),
        # and the most evictable blocks kept (RAM byte budget)
        self.free: dict[str, list[int]] = {c: list(range(hi - 1, lo - 1, -1)) for c, lo, hi in self.ranges}
        self.evictable: dict[str, OrderedDict[int, None]] = {c: OrderedDict() for c, _, _ in self.ranges}
        self.limit: dict[str, int | None] = {c: None for c, _, _ in self.ranges}
        self.cached: dict[bytes, int] = {}  # full blocks by chained hash
        self.partials: dict[bytes, int] = {}  # partial blocks by H(parent, tokens)
        self.children: dict[bytes, set[int]] = {}  # parent hash -> cached blocks (full or partial)
        self.on_evict: Callable[[int, _Meta], None] | None = None
        self.evicted = 0

    def cls_of(self, b: int) -> str:
        for c, lo, hi in self.ranges:
            if lo <= b < hi:
                return c
        raise IndexError(f"block {b} is not in group {self.group.name!r}")

    def _cls(self, cls: str) -> str:
        if cls not in self.free:
            have = ", ".join(repr(c) for c in self.free)
            raise KeyError(f"group {self.group.name!r} has no storage class {cls!r} (it has {have})")
        return cls

    def num_free(self, cls: str | None = None) -> int:
        if cls is None:
            return sum(len(f) for f in self.free.values()) + self.num_evictable()
        return len(self.free[self._cls(cls)]) + len(self.evictable[cls])

    def num_evictable(self) -> int:
        return sum(len(e) for e in self.evictable.values())

    def _forget(self, b: int) -> None:
        """Drop block b's cache identity (it keeps its ref count)."""
        m = self.meta[b]
        if m is not None:
            if m.partial:
                self.partials.pop(m.h, None)
            elif self.cached.get(m.h) == b:
                del self.cached[m.h]
            kids = self.children.get(m.parent)
            if kids is not None:
                kids.discard(b)
                if not kids:
                    del self.children[m.parent]
        self.meta[b] = None
        self.hash_of[b] = None

    def _evict_oldest(self, cls: str) -> int:
        b, _ = self.evictable[cls].popitem(last=False)
        m = self.meta[b]
        if m is not None and not m.partial and self.on_evict is not None:
            self.on_evict(b, m)
        self._forget(b)
        self.evicted += 1
        return b

    def take_free(self, cls: str = "") -> int:
        free = self.free[self._cls(cls)]
        b = free.pop() if free else self._evict_oldest(cls)
        self.ref[b] = 1
        return b

    def take_cached(self, b: int) -> None:
        if self.ref[b] == 0:
            self.evictable[self.cls_of(b)].pop(b, None)
        self.ref[b] += 1

    def _is_kept(self, b: int) -> bool:
        m = self.meta[b]
        return m is not None and (self.partials.get(m.h) == b if m.partial else self.cached.get(m.h) == b)

    def release(self, b: int) -> None:
        self.ref[b] -= 1
        assert self.ref[b] >= 0, "block released twice"
        if self.ref[b] == 0:
            cls = self.cls_of(b)
            if self._is_kept(b):
                self.evictable[cls][b] = None
                self.enforce_limit(cls)
            else:
                self._forget(b)
                self.free[cls].append(b)

    def enforce_limit(self, cls: str) -> None:
        limit = self.limit[cls]
        while limit is not None and len(self.evictable[cls]) > limit:
            self.free[cls].append(self._evict_oldest(cls))

    def publish(self, b: int, h: bytes, parent: bytes = b"", tokens: Tokens = (), namespace: str = "") -> bool:
        """Make b findable by h; False if b already has an identity or h has a block."""
        if self.hash_of[b] is None and h not in self.cached:
            self.hash_of[b] = h
            self.cached[h] = b
            self.meta[b] = _Meta(h, parent, tokens, namespace)
            self.children.setdefault(parent, set()).add(b)
            return True
        return False

    def keep_partial(self, b: int, parent: bytes, tokens: Tokens, namespace: str) -> None:
        pk = hashlib.blake2b(b"partial" + parent + np.asarray(tokens, dtype=np.int64).tobytes(),
                             digest_size=16).digest()
        if self.hash_of[b] is None and pk not in self.partials:
            self.hash_of[b] = pk
            self.partials[pk] = b
            self.meta[b] = _Meta(pk, parent, tokens, namespace, partial=True)
            self.children.setdefault(parent, set()).add(b)

    def clear_cache(self) -> None:
        for cls, ev in self.evictable.items():
            while ev:
                b, _ = ev.popitem(last=False)
                self._forget(b)
                self.free[cls].append(b)


@dataclass
class _ReqBlocks:
    tables: dict[str, list[int]]
    hashes: list[bytes] = field(default_factory=list)
    num_published: int = 0  # blocks whose hash was published
    namespace: str = ""
    classes: BlockClasses = field(default_factory=BlockClasses)
    # latest commit: tokens and how many are confirmed (for keeping the partial tail at free)
    last_ids: Sequence[int] = ()
    num_confirmed: int = 0


class BlockManager:
    def __init__(self, groups: Sequence[KVGroup], block_size: int, enable_prefix_caching: bool = True):
        if not groups:
            raise ValueError("at least one KV group")
        self.block_size = block_size
        self.groups = {g.name: g for g in groups}
        self.pools = {g.name: _GroupPool(g) for g in groups}
        names = [{c for c, _, _ in p.ranges} for p in self.pools.values()]
        if any(n != names[0] for n in names):
            raise ValueError("every KV group needs the same storage classes")
        # requests that name no classes use the first one
        self.default_classes = BlockClasses(high=self.pools[groups[0].name].ranges[0][0])
        self.enable_prefix_caching = enable_prefix_caching
        self.reqs: dict[str, _ReqBlocks] = {}
        self.prefix_hit_tokens = 0  # counter: tokens served from shared blocks
        self.partial_hit_tokens = 0  # counter: of those, tokens copied from partial matches
        self.restored_blocks = 0  # counter: blocks brought back from the lower tier
        self.tier: CacheTier | None = None

    # ---- cache tier wiring -------------------------------------------------
    def attach_tier(self, tier: CacheTier | None) -> None:
        """Hook a lower tier (SSD, write-behind, copy-on-write) under the RAM blocks."""
        self.tier = tier
        for name, pool in self.pools.items():
            if tier is None:
                pool.on_evict = None
            else:
                pool.on_evict = (lambda b, m, n=name: tier.on_evict(m.namespace, n, b, m.h, m.tokens))

    def set_cache_limit(self, group: str, max_blocks: int | None, cls: str | None = None) -> None:
        """Keep at most `max_blocks` unreferenced cached blocks in `group` (RAM budget), in
        storage class `cls` (None: every class of the group)."""
        pool = self.pools[group]
        for c in ([cls] if cls is not None else list(pool.limit)):
            pool.limit[pool._cls(c)] = max_blocks
            pool.enforce_limit(c)

    def class_names(self) -> list[str]:
        return [c for c, _, _ in next(iter(self.pools.values())).ranges]

    # ---- queries -------------------------------------------------------
    def num_free_blocks(self, group: str | None = None, cls: str | None = None) -> int:
        if group is not None:
            return self.pools[group].num_free(cls)
        return sum(p.num_free(cls) for p in self.pools.values())

    def num_total_blocks(self) -> int:
        return sum(g.num_blocks for g in self.groups.values())

    def num_cached_blocks(self, group: str | None = None) -> int:
        """Unreferenced blocks kept for reuse (the RAM tier's content)."""
        names = [group] if group else list(self.pools)
        return sum(self.pools[n].num_evictable() for n in names)

    def num_evicted_blocks(self) -> int:
        return sum(p.evicted for p in self.pools.values())

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

    def _restore(self, hashes: list[bytes], k: int, max_blocks: int, token_ids: Sequence[int], max_new: int,
                 namespace: str, classes: BlockClasses) -> list[tuple[str, int]]:
        """Bring blocks k.. of the chain back from the lower tier into RAM (as cached blocks),
        as far as the tier has them and the pool can spare the room. Returns the chain's
        blocks it pinned (one ref each, so neither restores nor the RAM limit evict them);
        the caller releases them."""
        tier = self.tier
        assert tier is not None
        bs = self.block_size

        def present(name: str, i: int) -> bool:
            return hashes[i] in self.pools[name].cached or tier.has(namespace, name, hashes[i])

        full = [g for g in self.groups.values() if g.window is None]
        sliding = [g for g in self.groups.values() if g.window is not None]
        j = k
        while j < max_blocks and all(present(g.name, j) for g in full):
            j += 1
        while j > k and not all(present(g.name, i) for g in sliding
                                for i in range(self._first_needed_block(g, j * bs), j)):
            j -= 1
        if j == k:
            return []
        # blocks the rest of the request will need, per class: restores must leave them free
        reserve = classes.count(j, self._blocks_for(min(len(token_ids), j * bs + max_new)))
        pinned: list[tuple[str, int]] = []
        for name, g in self.groups.items():
            pool = self.pools[name]
            for i in range(self._first_needed_block(g, j * bs), j):
                b = pool.cached.get(hashes[i])
                if b is not None:
                    pool.take_cached(b)
                    pinned.append((name, b))
                    continue
                cls = classes.of(i)
                if pool.num_free(cls) - 1 < reserve.get(cls, 0):
                    break
                b = pool.take_free(cls)
                if not tier.restore(namespace, name, hashes[i], b):
                    pool.release(b)
                    break
                parent = hashes[i - 1] if i else seed_hash(namespace)
                pool.publish(b, hashes[i], parent, tuple(token_ids[i * bs:(i + 1) * bs]), namespace)
                pinned.append((name, b))
                self.restored_blocks += 1
        return pinned

    def _partial_match(self, hashes: list[bytes], k: int, token_ids: Sequence[int],
                       namespace: str, cls: str) -> tuple[dict[str, int], int]:
        """A cached block right after the k matched ones whose first m tokens equal ours:
        (source block per group, m). m leaves at least one token to compute."""
        bs = self.block_size
        want = token_ids[k * bs: min((k + 1) * bs, len(token_ids) - 1)]
        if not want:
            return {}, 0
        parent = hashes[k - 1] if k else seed_hash(namespace)
        src: dict[str, int] = {}
        best = bs
        for name, pool in self.pools.items():
            top, top_b = 0, -1
            for b in pool.children.get(parent, ()):
                if pool.cls_of(b) != cls:  # rows are copied as stored: same precision only
                    continue
                toks = pool.meta[b].tokens  # type: ignore[union-attr]
                m = 0
                for a, c in zip(toks, want):
                    if a != c:
                        break
                    m += 1
                if m > top:
                    top, top_b = m, b
            if top == 0:
                return {}, 0
            src[name] = top_b
            best = min(best, top)
        return src, best

    # ---- allocation ----------------------------------------------------
    def _plan(self, hashes: list[bytes], k: int, cached: int, total: int,
              src: dict[str, int], classes: BlockClasses) -> dict[str, list[int]] | None:
        plan: dict[str, list[int]] = {}
        need = classes.count(k, self._blocks_for(total))
        for name, g in self.groups.items():
            pool = self.pools[name]
            lo = self._first_needed_block(g, cached)
            hit = [pool.cached[hashes[i]] for i in range(lo, k)]
            # hit (and copy-source) blocks sitting in the evictable list stop being free once taken
            taken = hit + ([src[name]] if name in src else [])
            for cls, n in need.items():
                reclaim = sum(1 for b in taken if pool.ref[b] == 0 and pool.cls_of(b) == cls)
                if n > pool.num_free(cls) - reclaim:
                    return None
            plan[name] = hit
        return plan

    def admit(self, req_id: str, token_ids: Sequence[int], max_new: int, namespace: str = "",
              classes: BlockClasses | None = None) -> tuple[int, int] | None:
        """Start a request: reuse its longest cached prefix (RAM, else restored from the
        lower tier, plus a copied partial block), then allocate blocks for up to `max_new`
        more tokens after it. Returns (cached tokens, new tokens), or None (no blocks
        taken) when the pool cannot hold it now.

        At least one token is always left to compute, so the step yields logits.
        `classes` says which storage class each block comes from (default: the first).
        """
        assert req_id not in self.reqs
        classes = classes or self.default_classes
        bs = self.block_size
        n = len(token_ids)
        max_blocks = (n - 1) // bs
        hashes = chain_hashes(token_ids, bs, namespace, classes=classes) if self.enable_prefix_caching else []
        k = self._match(hashes, max_blocks) if hashes else 0
        pinned: list[tuple[str, int]] = []
        if self.tier is not None and hashes and k < max_blocks:
            pinned = self._restore(hashes, k, max_blocks, token_ids, max_new, namespace, classes)
            k = self._match(hashes, max_blocks)
        try:
            return self._admit(req_id, token_ids, max_new, namespace, hashes, k, classes)
        finally:
            for name, b in reversed(pinned):  # descendants first: ancestors stay newest
                self.pools[name].release(b)

    def _admit(self, req_id: str, token_ids: Sequence[int], max_new: int, namespace: str, hashes: list[bytes],
               k: int, classes: BlockClasses) -> tuple[int, int] | None:
        bs = self.block_size
        n = len(token_ids)
        src, m = ({}, 0)
        if self.tier is not None and self.enable_prefix_caching:
            src, m = self._partial_match(hashes, k, token_ids, namespace, classes.of(k))
        plan = None
        for src, m in ((src, m), ({}, 0)) if m else (({}, 0),):
            cached = k * bs + m
            num_new = min(n - cached, max_new)
            total = cached + num_new
            plan = self._plan(hashes, k, cached, total, src, classes)
            if plan is not None:
                break
        if plan is None:
            return None
        tables: dict[str, list[int]] = {}
        for name, g in self.groups.items():
            pool = self.pools[name]
            if name in src:
                pool.take_cached(src[name])  # pin the copy source while new blocks are taken
            lo = self._first_needed_block(g, cached)
            for b in plan[name]:
                pool.take_cached(b)
            t = [NULL_BLOCK] * lo + plan[name]
            t += [pool.take_free(classes.of(i)) for i in range(k, self._blocks_for(total))]
            tables[name] = t
            if name in src:
                assert self.tier is not None
                self.tier.copy_rows(name, src[name], t[k], m)
                pool.release(src[name])
        self.reqs[req_id] = _ReqBlocks(tables=tables, hashes=hashes[:k], num_published=k, namespace=namespace,
                                       classes=classes)
        self.prefix_hit_tokens += cached
        self.partial_hit_tokens += m
        return cached, num_new

    def can_grow(self, req_id: str, num_tokens: int) -> bool:
        r = self.reqs[req_id]
        need = self._blocks_for(num_tokens)
        return all(c <= self.pools[n].num_free(cls)
                   for n in self.groups for cls, c in r.classes.count(len(r.tables[n]), need).items())

    def grow(self, req_id: str, num_tokens: int) -> bool:
        """Make the tables cover positions [0, num_tokens). All or nothing."""
        if not self.can_grow(req_id, num_tokens):
            return False
        r = self.reqs[req_id]
        need = self._blocks_for(num_tokens)
        for n in self.groups:
            t = r.tables[n]
            while len(t) < need:
                t.append(self.pools[n].take_free(r.classes.of(len(t))))
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
                r.hashes = chain_hashes(token_ids[: n_full * bs], bs, namespace, prev=r.hashes, classes=r.classes)
            if n_full > r.num_published:
                seed = seed_hash(namespace) if r.num_published == 0 else b""
                for n in self.groups:
                    pool = self.pools[n]
                    fresh: list[tuple[int, bytes, Tokens]] = []
                    for i in range(r.num_published, n_full):
                        b = r.tables[n][i]
                        if b == NULL_BLOCK:
                            continue
                        toks = tuple(token_ids[i * bs:(i + 1) * bs])
                        if pool.publish(b, r.hashes[i], r.hashes[i - 1] if i else seed, toks, namespace):
                            fresh.append((b, r.hashes[i], toks))
                    if fresh and self.tier is not None:
                        self.tier.on_publish(namespace, n, fresh)
            r.num_published = max(r.num_published, n_full)
            r.namespace = namespace
            r.last_ids, r.num_confirmed = token_ids, num_confirmed
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
        """Release every block of a request (tail first, so ancestors are evicted last).
        With a tier attached, its confirmed partial last block is kept for copy-on-write reuse."""
        r = self.reqs.pop(req_id, None)
        if r is None:
            return
        i = r.num_published
        tail = tuple(r.last_ids[i * self.block_size: r.num_confirmed])
        if self.tier is not None and self.enable_prefix_caching and tail and len(r.hashes) >= i:
            parent = r.hashes[i - 1] if i else seed_hash(r.namespace)
            for n in self.groups:
                t = r.tables[n]
                if i < len(t) and t[i] != NULL_BLOCK and self.pools[n].ref[t[i]] == 1:
                    self.pools[n].keep_partial(t[i], parent, tail, r.namespace)
        for n in self.groups:
            for b in reversed(r.tables[n]):
                if b != NULL_BLOCK:
                    self.pools[n].release(b)

    def reset_prefix_cache(self) -> None:
        for pool in self.pools.values():
            pool.clear_cache()
