"""A decode step's one-block pool calls (``get_new_block``, ``cache_full_block``): the same
changes as the general calls, done whole or not at all."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pagedkv.runtime import BlockPool, Request
from pagedkv.runtime.hashing import BlockHasher

from .helpers import cached_blocks

BLOCK_SIZE = 4


class Injected(Exception):
    pass


def pool_state(pool: BlockPool) -> tuple[Any, ...]:
    return (
        pool.queue.order(),
        list(pool.ref_cnt),
        cached_blocks(pool),
        pool.num_evictions,
        pool.take_events(),
    )


def filled_pool(events: bool, num_cached: int) -> tuple[BlockPool, Request, list[int]]:
    """A pool of 12 blocks: ``num_cached`` of them freed with their hashes, one request's
    table of three blocks, its first two cached."""
    pool = BlockPool(12, enable_events=events)
    hasher = BlockHasher(BLOCK_SIZE, "sha256_cbor")
    donor = Request("donor", list(range(100, 101 + BLOCK_SIZE * num_cached)), hasher=hasher)
    blocks = pool.get_new_blocks(num_cached)
    pool.cache_full_blocks(donor, blocks, 0, num_cached, BLOCK_SIZE, 0)
    pool.free_blocks(blocks)
    request = Request("a", list(range(BLOCK_SIZE * 3)), hasher=hasher)
    table = pool.get_new_blocks(3)
    pool.cache_full_blocks(request, table, 0, 2, BLOCK_SIZE, 0)
    pool.take_events()
    return pool, request, table


@settings(max_examples=40, deadline=None)
@given(events=st.booleans(), num_cached=st.integers(0, 8))
def test_one_new_block_is_the_first_of_get_new_blocks(events: bool, num_cached: int) -> None:
    pool, _, _ = filled_pool(events, num_cached)
    twin = copy.deepcopy(pool)
    assert pool.get_new_block() == twin.get_new_blocks(1)[0]
    assert pool_state(pool) == pool_state(twin)


@pytest.mark.parametrize("events", [False, True])
def test_one_cached_block_is_what_cache_full_blocks_keys(events: bool) -> None:
    pool, request, table = filled_pool(events, 4)
    twin = copy.deepcopy(pool)
    pool.cache_full_block(request, table, 2, BLOCK_SIZE, 0)
    twin.cache_full_blocks(request, table, 2, 3, BLOCK_SIZE, 0)
    assert pool_state(pool) == pool_state(twin)
    assert pool.key_of(table[2]) is not None


def test_a_one_block_key_that_duplicates_another_is_kept_as_the_general_call_keeps_it() -> None:
    pool, request, table = filled_pool(False, 0)
    other = pool.get_new_blocks(1)
    pool.cache_full_block(request, table[:2] + other, 2, BLOCK_SIZE, 0)  # table[2]'s key
    twin = copy.deepcopy(pool)
    pool.cache_full_block(request, table, 2, BLOCK_SIZE, 0)
    twin.cache_full_blocks(request, table, 2, 3, BLOCK_SIZE, 0)
    assert pool_state(pool) == pool_state(twin)


@pytest.mark.parametrize("method", ["get_new_blocks", "cache_full_blocks"])
def test_a_one_block_call_that_raises_changes_nothing(method: str) -> None:
    # With events on, both calls take the general path in their own transaction.
    pool, request, table = filled_pool(True, 4)
    before = pool_state(copy.deepcopy(pool))
    original = getattr(pool, method)

    def failing(*args: Any) -> Any:
        original(*args)
        raise Injected(method)

    setattr(pool, method, failing)
    with pytest.raises(Injected):
        if method == "get_new_blocks":
            pool.get_new_block()
        else:
            pool.cache_full_block(request, table, 2, BLOCK_SIZE, 0)
    delattr(pool, method)
    assert pool_state(pool) == before


@pytest.mark.parametrize("events", [False, True])
def test_one_block_calls_inside_a_transaction_are_rolled_back_with_it(events: bool) -> None:
    pool, request, table = filled_pool(events, 4)
    before = pool_state(copy.deepcopy(pool))
    savepoint = pool.begin()
    pool.get_new_block()
    pool.cache_full_block(request, table, 2, BLOCK_SIZE, 0)
    pool.rollback(savepoint)
    assert pool_state(pool) == before
