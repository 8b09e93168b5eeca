"""Block pool behaviour (reference section 9, cases 1-16)."""

from __future__ import annotations

import pytest

from pagedkv import BlockPool, BlockRemoved, BlockStored, NoFreeBlocksError
from pagedkv.errors import KVCacheRuntimeError
from pagedkv.runtime import AllBlocksCleared, Request
from pagedkv.runtime.hashing import BlockHasher

from .helpers import cached_blocks


def hashed_request(tokens: list[int], block_size: int = 4, rid: str = "r") -> Request:
    return Request(rid, tokens, hasher=BlockHasher(block_size))


def cache(pool: BlockPool, blocks: list[int], tokens: list[int], gid: int = 0) -> Request:
    req = hashed_request(tokens)
    pool.cache_full_blocks(req, blocks, 0, len(blocks), 4, gid)
    return req


def test_null_block_is_never_free_hashed_or_counted() -> None:
    pool = BlockPool(8, enable_caching=True, hash_block_size=4)
    assert 0 not in pool.queue.order()
    assert pool.num_free_blocks == 7
    blocks = pool.get_new_blocks(7)
    assert 0 not in blocks
    req = hashed_request(list(range(8)))
    pool.cache_full_blocks(req, [0, blocks[0]], 0, 2, 4, 0)
    assert pool.block_hash[0] is None
    pool.touch([0, 0])
    pool.free_blocks([0])
    assert pool.ref_cnt[0] == 0
    assert pool.num_free_blocks == 0


def test_usage_is_fraction_of_non_null_blocks() -> None:
    assert BlockPool(1).usage == 0.0
    pool = BlockPool(5)
    assert pool.usage == 0.0
    pool.get_new_blocks(2)
    assert pool.usage == pytest.approx(0.5)


def test_get_new_blocks_beyond_free_raises_and_changes_nothing() -> None:
    pool = BlockPool(6)
    held = pool.get_new_blocks(2)
    pool.free_blocks(held[:1])
    before = (pool.queue.order(), list(pool.ref_cnt))
    with pytest.raises(NoFreeBlocksError):
        pool.get_new_blocks(5)
    assert (pool.queue.order(), list(pool.ref_cnt)) == before
    assert pool.get_new_blocks(0) == []


def test_freed_unhashed_blocks_go_to_head_and_hashed_to_tail() -> None:
    pool = BlockPool(10)
    a, b, c, d = pool.get_new_blocks(4)
    cache(pool, [c, d], list(range(8)))
    pool.free_blocks([a, c, b, d])
    queue = pool.queue.order()
    assert queue[:2] == [a, b]  # unhashed, in the given order, reused first
    assert queue[-2:] == [c, d]  # hashed, least recently freed evicted first
    assert queue[2:-2] == list(range(5, 10))


def test_request_free_releases_last_block_first() -> None:
    from .helpers import full, make_manager

    manager = make_manager([full()], num_blocks=10)
    req = Request("r", list(range(13)))
    manager.allocate_slots(req, 13)
    table = manager.get_block_ids("r")[0]
    manager.free(req)
    queue = manager.block_pool.queue.order()
    # The three full blocks were cached: tail block first among them.
    assert queue[-3:] == table[:3][::-1]
    # The partial (unhashed) block is reused first.
    assert queue[0] == table[3]


def test_shared_block_is_only_decremented_until_last_reference() -> None:
    pool = BlockPool(4)
    (a,) = pool.get_new_blocks(1)
    pool.touch([a])
    pool.free_blocks([a])
    assert pool.ref_cnt[a] == 1 and a not in pool.queue.order()
    pool.free_blocks([a])
    assert pool.ref_cnt[a] == 0 and a in pool.queue.order()


def test_touch_revives_a_free_cached_block_from_the_middle() -> None:
    pool = BlockPool(8)
    blocks = pool.get_new_blocks(3)
    cache(pool, blocks, list(range(12)))
    pool.free_blocks(blocks)
    pool.touch([blocks[1]])
    assert pool.ref_cnt[blocks[1]] == 1
    assert blocks[1] not in pool.queue.order()
    assert pool.queue.order()[-2:] == [blocks[0], blocks[2]]
    pool.touch([blocks[1]])  # in use: only the count moves
    assert pool.ref_cnt[blocks[1]] == 2


def test_reusing_a_cached_block_drops_its_hash_with_one_event_per_key() -> None:
    pool = BlockPool(3, enable_events=True)
    blocks = pool.get_new_blocks(2)
    req = cache(pool, blocks, list(range(8)))
    pool.free_blocks(blocks)
    pool.take_events()
    reused = pool.get_new_blocks(2)
    assert reused == blocks
    events = pool.take_events()
    assert events == [
        BlockRemoved(block_hashes=[req.block_hashes[0]], medium="GPU", group_idx=0),
        BlockRemoved(block_hashes=[req.block_hashes[1]], medium="GPU", group_idx=0),
    ]
    assert cached_blocks(pool) == {}


def test_duplicate_content_blocks_share_a_key_first_inserted_wins() -> None:
    pool = BlockPool(6)
    a, b = pool.get_new_blocks(2)
    req = cache(pool, [a], list(range(4)))
    cache(pool, [b], list(range(4)))
    h = req.block_hashes[0]
    assert pool.get_cached_block(h, [0]) == [a]
    pool.evict_blocks([a])
    assert pool.get_cached_block(h, [0]) == [b]


def test_same_hash_in_two_groups_is_two_keys() -> None:
    pool = BlockPool(6)
    a, b = pool.get_new_blocks(2)
    req = cache(pool, [a], list(range(4)), gid=0)
    cache(pool, [b], list(range(4)), gid=1)
    h = req.block_hashes[0]
    assert pool.get_cached_block(h, [0]) == [a]
    assert pool.get_cached_block(h, [1]) == [b]
    assert pool.get_cached_block(h, [0, 1]) == [a, b]


def test_lookup_over_groups_misses_if_any_group_misses() -> None:
    pool = BlockPool(6)
    (a,) = pool.get_new_blocks(1)
    req = cache(pool, [a], list(range(4)), gid=0)
    assert pool.get_cached_block(req.block_hashes[0], [0, 1]) is None


def test_cache_full_blocks_caches_only_hashed_full_blocks_and_is_idempotent() -> None:
    pool = BlockPool(8, enable_events=True)
    blocks = pool.get_new_blocks(3)
    req = hashed_request(list(range(10)))  # two full hash blocks
    num_full = min(12, len(req.block_hashes) * 4) // 4
    pool.cache_full_blocks(req, blocks, 0, num_full, 4, 0)
    assert [pool.block_hash[b] is not None for b in blocks] == [True, True, False]
    pool.take_events()
    pool.cache_full_blocks(req, blocks, 2, 2, 4, 0)
    assert pool.take_events() == []


def test_null_blocks_are_skipped_but_the_event_covers_all_tokens() -> None:
    pool = BlockPool(8, enable_events=True)
    (a,) = pool.get_new_blocks(1)
    req = hashed_request(list(range(12)))
    pool.cache_full_blocks(req, [0, 0, a], 1, 3, 4, 0)
    (event,) = pool.take_events()
    assert isinstance(event, BlockStored)
    assert event.block_hashes == [req.block_hashes[2]]
    assert event.parent_block_hash == req.block_hashes[0]
    assert event.token_ids == list(range(4, 12))
    pool.cache_full_blocks(req, [0, 0, a], 0, 2, 4, 0)
    (empty,) = pool.take_events()
    assert isinstance(empty, BlockStored) and empty.block_hashes == []


def test_reset_prefix_cache_refused_while_in_use_then_clears_everything() -> None:
    pool = BlockPool(6, enable_events=True)
    blocks = pool.get_new_blocks(2)
    req = cache(pool, blocks, list(range(8)))
    assert pool.reset_prefix_cache() is False
    pool.free_blocks(blocks)
    queue = pool.queue.order()
    pool.take_events()
    assert pool.reset_prefix_cache() is True
    assert pool.take_events() == [AllBlocksCleared()]
    assert pool.get_cached_block(req.block_hashes[0], [0]) is None
    assert pool.queue.order() == queue  # order untouched
    assert all(key is None for key in pool.block_hash)


def test_evict_blocks_drops_hash_of_in_use_block_and_rejects_bad_ids() -> None:
    pool = BlockPool(6)
    blocks = pool.get_new_blocks(2)
    req = cache(pool, blocks, list(range(8)))
    pool.evict_blocks([blocks[0]])
    assert pool.block_hash[blocks[0]] is None
    assert pool.ref_cnt[blocks[0]] == 1
    assert pool.get_cached_block(req.block_hashes[0], [0]) is None
    with pytest.raises(KVCacheRuntimeError, match="outside the pool"):
        pool.evict_blocks([6])


def test_pool_rejects_non_positive_size() -> None:
    with pytest.raises(KVCacheRuntimeError, match="num_blocks"):
        BlockPool(0)


def test_fresh_blocks_are_handed_out_in_id_order_after_freed_ones() -> None:
    pool = BlockPool(10)
    first = pool.get_new_blocks(3)
    assert first == [1, 2, 3]
    pool.free_blocks([2])
    assert pool.get_new_blocks(3) == [2, 4, 5]


def test_a_key_records_the_tokens_it_covers() -> None:
    pool = BlockPool(8, enable_caching=True, hash_block_size=4)
    blocks = pool.get_new_blocks(3)
    req = hashed_request(list(range(24)))
    pool.cache_full_blocks(req, blocks, 0, 2, 4, 0)
    assert [pool.keyed_at(b, n, 4) for b, n in zip(blocks[:2], (4, 8), strict=True)] == [
        True,
        True,
    ]
    # A key at a hash boundary: inside an 8-token block, or on its end.
    pool.cache_partial_block(req, blocks[2], 12, 1, 8)
    assert pool.sub_block_key_tokens(blocks[2]) == 12
    other = pool.get_new_blocks(1)[0]
    pool.cache_partial_block(req, other, 16, 1, 8)
    assert pool.sub_block_key_tokens(other) is None
    assert pool.keyed_at(other, 16, 8)
    # Moving a block's keys moves the count.
    copy = pool.get_new_blocks(1)[0]
    pool.move_block_keys(blocks[2], copy)
    assert pool.sub_block_key_tokens(copy) == 12
    assert pool.key_of(blocks[2]) is None


def test_caching_past_the_request_s_hashes_is_refused_and_changes_nothing() -> None:
    pool = BlockPool(8, enable_caching=True, hash_block_size=4)
    blocks = pool.get_new_blocks(3)
    req = hashed_request(list(range(8)))
    with pytest.raises(KVCacheRuntimeError, match="2 block hashes"):
        pool.cache_full_blocks(req, blocks, 0, 3, 4, 0)
    assert [pool.key_of(b) for b in blocks] == [None, None, None]


def test_a_rolled_back_eviction_restores_the_keys() -> None:
    pool = BlockPool(3, enable_caching=True, hash_block_size=4)
    req = cache(pool, pool.get_new_blocks(2), list(range(8)))
    pool.free_blocks([1, 2])
    savepoint = pool.begin()
    reused = pool.get_new_blocks(2)  # both lose their keys
    other = hashed_request([9] * 12, rid="o")
    pool.cache_full_blocks(other, reused[::-1], 1, 2, 4, 0)  # 8 tokens now
    pool.rollback(savepoint)
    assert pool.get_cached_block(req.block_hashes[1], [0]) == [2]
    assert pool.get_cached_block(req.block_hashes[0], [0]) == [1]
