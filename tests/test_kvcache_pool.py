"""The prefix pool: hash chains, reference counts, LRU eviction of unreferenced blocks only, byte budget;
and sessions that leave every reference released."""

from __future__ import annotations

import gc

import pytest
import torch

from couplet.kvcache import MODES, PrefixPool, make_mode
from couplet.kvcache.layer import KVGeometry
from couplet.kvcache.pool import chain_keys

# These prompts are a few tokens long: 2-token blocks (the default, 8, suits the ~415-token couplet prompt)
SHORT_BLOCK = 2

torch.set_num_threads(1)


def add(pool: PrefixPool, key: bytes, nbytes: int = 100):
    t = torch.zeros(nbytes, dtype=torch.uint8)
    return pool.insert(key, ((t,),), [t])


def test_chain_keys_identify_the_whole_prefix() -> None:
    a = chain_keys("ns", [1, 2, 3, 4, 5], 2)
    assert len(a) == 2  # the partial block has no key
    assert chain_keys("ns", [1, 2, 3, 4, 9, 9], 2)[:2] == a
    assert chain_keys("ns", [7, 2, 3, 4], 2)[1] != a[1]  # same block tokens, different parent
    assert chain_keys("other", [1, 2, 3, 4], 2) != a  # another model / format / block size


def test_refcounts_lru_and_budget() -> None:
    pool = PrefixPool(max_bytes=300)
    a, b, c = add(pool, b"a"), add(pool, b"b"), add(pool, b"c")
    assert pool.nbytes == 300 and [blk.refs for blk in (a, b, c)] == [1, 1, 1]
    assert add(pool, b"d") is None and pool.rejected == 1  # everything referenced: no room, nothing evicted
    pool.release([b])
    pool.release([a])  # now LRU order: b, a
    assert pool.acquire_prefix([b"b"]) == [b]  # a hit refreshes b
    pool.release([b])  # LRU order: a, b
    d = add(pool, b"d")
    assert d is not None and b"a" not in pool and b"b" in pool and b"c" in pool
    assert pool.nbytes == 300 <= pool.max_bytes and pool.evictions == 1
    assert add(pool, b"c").refs == 2  # inserting a known key references the existing block
    pool.release([c, d])
    pool.release([c])
    assert pool.total_refs() == 0
    pool.clear()
    assert len(pool) == 0 and pool.nbytes == 0
    with pytest.raises(RuntimeError):
        pool.release([c])


def test_chains_are_evicted_leaf_first() -> None:
    pool = PrefixPool(max_bytes=300)
    root, mid, leaf = add(pool, b"r"), add(pool, b"m"), add(pool, b"l")
    pool.release([root, mid, leaf])  # a request ending releases its chain
    add(pool, b"x")
    assert b"l" not in pool and b"r" in pool and b"m" in pool


def test_a_lease_sets_room_aside_that_no_other_insertion_can_take() -> None:
    pool = PrefixPool(max_bytes=300)
    a = add(pool, b"a")
    pool.release([a])  # cached, unreferenced: evictable
    assert pool.lease([b"a", b"x", b"y"], 200) is None and pool.leased == 0 and a.pins == 0  # 100 + 2 x 200
    lease = pool.lease([b"a", b"x"], 100)
    assert lease is not None and a.pins == 1 and a.refs == 0 and pool.leased == 100 and lease.pending == {b"x"}
    twin = pool.lease([b"a", b"x"], 100)  # a second wave with the same prompt: the room is set aside once
    assert twin is not None and a.pins == 2 and pool.leased == 100
    assert add(pool, b"o1") is not None  # 100 (a, pinned: not evicted) + 100 (o1) + 100 leased
    assert add(pool, b"o2") is None and pool.rejected == 1 and b"a" in pool  # would take the leased room
    x = add(pool, b"x")  # the leased key: takes its room, and both leases pin it
    assert x is not None and (x.refs, x.pins) == (1, 2) and pool.leased == 0 and lease.pending == set()
    assert lease.blocks == [a, x] and pool.total_refs() == 2 + 3 + 1  # pins count: a lease left is a leak
    pool.release([x])  # the inserting session is done; the leases still pin x
    pool.end_lease(lease)
    pool.end_lease(lease)  # idempotent
    assert a.pins == 1 and x.pins == 1
    pool.end_lease(twin)
    assert (a.refs, a.pins, x.refs, x.pins) == (0, 0, 0, 0) and pool.leased == 0
    assert add(pool, b"o2") is not None and add(pool, b"o3") is not None  # unpinned: evictable again
    assert pool.evictions == 2


def test_an_ended_lease_gives_back_the_room_of_blocks_never_inserted() -> None:
    pool = PrefixPool(max_bytes=300)
    lease = pool.lease([b"p", b"q"], 100)
    assert lease is not None and pool.leased == 200
    assert add(pool, b"o1") is not None and add(pool, b"o2") is None  # 100 + 200 leased
    pool.end_lease(lease)
    assert pool.leased == 0 and add(pool, b"o2") is not None


@pytest.mark.parametrize("mode", [m for m in MODES if make_mode(m).compose().sharing is not None])
def test_the_room_leased_per_block_is_a_real_blocks_size(tiny_llama, mode: str) -> None:
    pool = PrefixPool()
    with make_mode(mode, block_size=SHORT_BLOCK).new_session(tiny_llama, pool=pool) as s:
        s.forward(torch.tensor([[1, 7, 12, 30, 5, 44, 9]]))
        sizes = {blk.nbytes for blk in pool._blocks.values()}
    assert sizes == {make_mode(mode, block_size=SHORT_BLOCK).compose().block_bytes(KVGeometry.of(tiny_llama))}


@pytest.mark.parametrize("mode", [m for m in MODES if make_mode(m).compose().sharing is not None])
def test_sessions_release_every_reference(tiny_llama, mode: str) -> None:
    pool = PrefixPool()
    prompt = torch.tensor([[1, 7, 12, 30, 5, 44, 9]])
    s1 = make_mode(mode, block_size=SHORT_BLOCK).new_session(tiny_llama, pool=pool)
    s1.forward(prompt)
    assert len(pool) == 3 and pool.total_refs() == 3
    with make_mode(mode, block_size=SHORT_BLOCK).new_session(tiny_llama, pool=pool) as s2:
        s2.forward(prompt)
        assert pool.total_refs() == 6 and pool.hits == 3
        share = s2.stats().shared_bytes
        assert share == pool.nbytes // 2  # each block is referenced by two live requests
    assert pool.total_refs() == 3
    s1.close()
    s1.close()  # idempotent
    assert pool.total_refs() == 0 and len(pool) == 3  # unreferenced blocks stay cached until evicted
    s3 = make_mode(mode, block_size=SHORT_BLOCK).new_session(tiny_llama, pool=pool)
    s3.forward(prompt)
    assert pool.total_refs() == 3
    del s3
    gc.collect()
    assert pool.total_refs() == 0  # a session dropped without close() still releases its blocks
    with pytest.raises(RuntimeError, match="closed"):
        s1.forward(prompt)


def test_pool_budget_is_respected_by_sessions(tiny_llama) -> None:
    pool = PrefixPool(max_bytes=2 * 2 * 2 * 2 * 8 * 4 * 2)  # room for two full-precision blocks of 2 tokens
    with make_mode("shared", block_size=SHORT_BLOCK).new_session(tiny_llama, pool=pool) as s:
        s.forward(torch.tensor([[1, 7, 12, 30, 5, 44, 9]]))
        assert len(pool) == 2 and pool.nbytes <= pool.max_bytes and pool.rejected == 1
        assert s.cache.layers[0].prefix_len == 4  # the third block stays private to the request
    with make_mode("shared", block_size=SHORT_BLOCK).new_session(tiny_llama, pool=pool) as s:
        s.forward(torch.tensor([[2, 8, 13, 31, 6]]))  # new prompt: the old blocks are unreferenced -> evicted
        assert pool.nbytes <= pool.max_bytes and pool.evictions == 2
