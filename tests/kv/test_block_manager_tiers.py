"""Block manager with a cache tier: RAM limit, persist-before-evict, restore at admission,
partial-block copy-on-write. A fake tier records what the block manager asks of it."""

from augury.kv.block_manager import BlockManager, KVGroup, chain_hashes

BS = 4


class FakeTier:
    def __init__(self):
        self.disk: dict[tuple[str, str, bytes], tuple] = {}  # what a lower tier holds
        self.rows: dict[tuple[str, int], tuple] = {}  # what each pool block "contains"
        self.published, self.evicted, self.copies, self.restored = [], [], [], []

    def has(self, ns, group, h):
        return (ns, group, h) in self.disk

    def restore(self, ns, group, h, block):
        self.rows[(group, block)] = self.disk[(ns, group, h)]
        self.restored.append(h)
        return True

    def on_publish(self, ns, group, items):
        for b, h, toks in items:
            self.published.append(h)
            self.disk[(ns, group, h)] = toks

    def on_evict(self, ns, group, block, h, tokens):
        self.evicted.append(h)

    def copy_rows(self, group, src, dst, n):
        self.copies.append((group, src, dst, n))


def bm(n=16, tier=None):
    m = BlockManager([KVGroup("full", n)], BS, True)
    if tier is not None:
        m.attach_tier(tier)
    return m


def run(m, rid, toks, ns=""):
    got = m.admit(rid, toks, 1000, ns)
    m.commit(rid, toks, len(toks), ns)
    m.free(rid)
    return got


def test_ram_limit_keeps_newest_and_counts_evictions():
    m = bm()
    m.set_cache_limit("full", 3)
    run(m, "a", list(range(16)))  # 4 full blocks published
    assert m.num_cached_blocks() == 3 and m.num_evicted_blocks() == 1
    hs = chain_hashes(list(range(16)), BS, "")
    cached = m.pools["full"].cached
    # tail released first → oldest → evicted first: ancestors outlive descendants
    assert hs[3] not in cached and all(h in cached for h in hs[:3])
    assert m.num_free_blocks() == 16
    m.set_cache_limit("full", 1)
    assert hs[0] in cached and len(cached) == 1


def test_lru_across_requests():
    m = bm(n=6)
    m.set_cache_limit("full", 4)
    a, b = list(range(8)), list(range(100, 108))
    run(m, "a", a)
    run(m, "b", b)
    assert m.admit("c", a + [1], 1000)[0] == 8  # touch a
    m.free("c")
    run(m, "d", list(range(200, 208)))  # 2 new blocks: b's are the least recently used
    ha, hb = chain_hashes(a, BS, ""), chain_hashes(b, BS, "")
    cached = m.pools["full"].cached
    assert all(h in cached for h in ha) and not any(h in cached for h in hb)


def test_persist_before_evict_sees_every_full_block_it_drops():
    tier = FakeTier()
    m = bm(n=4, tier=tier)
    toks = list(range(16))
    run(m, "a", toks)
    assert tier.published == chain_hashes(toks, BS, "")
    run(m, "b", list(range(50, 58)))  # reuses slots of a's tail blocks
    assert tier.evicted == chain_hashes(toks, BS, "")[2:][::-1]  # the tail, descendants first


def test_restore_from_lower_tier_at_admission():
    tier = FakeTier()
    m = bm(n=8, tier=tier)
    toks = list(range(20))
    run(m, "a", toks)
    m.reset_prefix_cache()  # RAM forgets; the tier still has the blocks
    assert m.num_cached_blocks() == 0
    cached, new = m.admit("b", toks + [5], 1000)
    assert cached == 20 and new == 1
    assert tier.restored == chain_hashes(toks, BS, "") and m.restored_blocks == 5
    m.free("b")
    # restored blocks are ordinary cached blocks now
    assert m.admit("c", toks + [6], 1000)[0] == 20 and m.restored_blocks == 5


def test_restore_is_limited_by_free_blocks_and_never_evicts_its_own_chain():
    tier = FakeTier()
    m = bm(n=6, tier=tier)
    toks = list(range(20))  # 5 blocks
    run(m, "a", toks[:8])
    run(m, "x", list(range(100, 120)))  # fills the tier with 5 more blocks; a's RAM blocks are evicted
    m.reset_prefix_cache()
    got = m.admit("b", toks[:8] + list(range(300, 316)), 1000)
    assert got is not None and got[0] == 8


def test_partial_block_copy_on_write():
    tier = FakeTier()
    m = bm(tier=tier)
    first = list(range(10))  # blocks [0..3][4..7] + partial [8, 9]
    run(m, "a", first)
    second = first + [42, 43]
    cached, new = m.admit("b", second, 1000)
    assert cached == 10 and new == 2 and m.partial_hit_tokens == 2
    (group, src, dst, n), = tier.copies
    assert n == 2 and src != dst and dst == m.block_tables("b")["full"][2]
    m.free("b")


def test_partial_match_inside_a_full_block_and_one_token_left():
    tier = FakeTier()
    m = bm(tier=tier)
    toks = list(range(12))
    run(m, "a", toks)
    cached, new = m.admit("b", toks, 1000)  # identical prompt: all but the last token
    assert (cached, new) == (11, 1)
    m.free("b")
    cached, _ = m.admit("c", toks[:6] + [77, 78], 1000)  # diverges inside block 1
    assert cached == 6
    m.free("c")


def test_every_block_returns_with_tier_and_partials():
    tier = FakeTier()
    m = bm(n=8, tier=tier)
    for i in range(10):
        toks = list(range(i, i + 7 + i % 5))
        got = m.admit(f"r{i}", toks, 1000)
        if got is not None:
            m.commit(f"r{i}", toks, len(toks))
            m.free(f"r{i}")
    assert m.num_free_blocks() == 8
    m.reset_prefix_cache()
    assert len(m.pools["full"].free[""]) == 8 and not m.pools["full"].children


def test_restore_with_a_sliding_group_brings_back_only_the_window():
    tier = FakeTier()
    m = BlockManager([KVGroup("full", 16), KVGroup("sliding", 16, 6)], BS, True)
    m.attach_tier(tier)
    toks = list(range(20))
    run(m, "a", toks)
    m.reset_prefix_cache()
    tier.restored.clear()
    cached, _ = m.admit("b", toks + [9], 1000)
    assert cached == 20
    t = m.block_tables("b")
    hs = chain_hashes(toks, BS, "")
    # full layers need every block; sliding layers only those the next query can see
    assert tier.restored.count(hs[0]) == 1 and tier.restored.count(hs[4]) == 2
    assert t["sliding"][0] == -1 and t["sliding"][4] != -1
    m.free("b")
    assert m.num_free_blocks() == 32
