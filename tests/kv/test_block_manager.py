"""Block manager: ref counts, prefix sharing, eviction order, trim, sliding release."""

from augury.kv.block_manager import NULL_BLOCK, BlockManager, KVGroup, chain_hashes

BS = 4


def bm(n=16, window=None, caching=True):
    groups = [KVGroup("full", n)]
    if window:
        groups.append(KVGroup("sliding", n, window))
    return BlockManager(groups, BS, caching)


def test_admit_grow_free_returns_every_block():
    m = bm()
    start = m.num_free_blocks()
    cached, new = m.admit("a", list(range(10)), max_new=100)
    assert (cached, new) == (0, 10)
    assert len(m.block_tables("a")["full"]) == 3
    assert m.grow("a", 13)
    assert len(m.block_tables("a")["full"]) == 4
    m.free("a")
    assert m.num_free_blocks() == start


def test_admit_refuses_without_changing_anything():
    m = bm(n=3)
    assert m.admit("a", list(range(20)), max_new=100) is None
    assert m.num_free_blocks() == 3 and not m.has("a")


def test_prefix_hit_shares_blocks_and_leaves_one_token():
    m = bm()
    toks = list(range(12))
    m.admit("a", toks, 100)
    m.commit("a", toks, 12)
    m.free("a")
    cached, new = m.admit("b", toks, 100)  # identical prompt: last token recomputed
    assert cached == 8 and new == 4
    cached2, _ = m.admit("c", toks + [99, 98], 100)
    assert cached2 == 12
    # shared blocks
    assert m.block_tables("b")["full"][:2] == m.block_tables("c")["full"][:2]
    assert m.prefix_hit_tokens == 20


def test_namespace_separates_prefixes():
    m = bm()
    toks = list(range(12))
    m.admit("a", toks, 100, namespace="x")
    m.commit("a", toks, 12, namespace="x")
    m.free("a")
    cached, _ = m.admit("b", toks, 100, namespace="y")
    assert cached == 0


def test_eviction_prefers_descendants_and_oldest():
    m = bm(n=4)
    toks = list(range(16))
    m.admit("a", toks, 100)
    m.commit("a", toks, 16)
    m.free("a")  # 4 cached blocks, evictable tail-first
    m.admit("b", [50, 51, 52], 100)  # needs 1 block: evicts block of tokens 12..15 (the tail)
    hs = chain_hashes(toks, BS, "")
    full = m.pools["full"]
    assert hs[0] in full.cached and hs[2] in full.cached and hs[3] not in full.cached


def test_trim_releases_draft_blocks():
    m = bm()
    start = m.num_free_blocks()
    m.admit("a", list(range(5)), 100)
    m.commit("a", list(range(5)), 5)
    assert m.grow("a", 5 + 10)
    assert len(m.block_tables("a")["full"]) == 4
    m.trim("a", 6)
    assert len(m.block_tables("a")["full"]) == 2
    m.free("a")
    assert m.num_free_blocks() == start


def test_sliding_group_releases_blocks_out_of_window():
    m = bm(n=16, window=6)
    toks = list(range(20))
    m.admit("a", toks, 100)
    m.commit("a", toks, 20)
    t = m.block_tables("a")
    # next query at pos 20 sees keys >= 15 → blocks 0..2 (pos 0..11) released
    assert t["sliding"][:3] == [NULL_BLOCK] * 3 and t["sliding"][3] != NULL_BLOCK
    assert NULL_BLOCK not in t["full"]
    m.free("a")
    assert m.num_free_blocks() == 32


def test_sliding_prefix_hit_needs_window_blocks():
    m = bm(n=16, window=6)
    toks = list(range(20))
    m.admit("a", toks, 100)
    m.commit("a", toks, 20)
    m.free("a")
    cached, _ = m.admit("b", toks + [7], 100)
    assert cached == 20
    t = m.block_tables("b")["sliding"]
    assert t[0] == NULL_BLOCK and t[4] != NULL_BLOCK


def test_caching_off_never_shares():
    m = bm(caching=False)
    toks = list(range(12))
    m.admit("a", toks, 100)
    m.commit("a", toks, 12)
    m.free("a")
    assert m.admit("b", toks, 100) == (0, 12)
