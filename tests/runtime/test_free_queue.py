"""The free queue interface: vLLM's LRU order, exact undo, and a pool built on another order."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pagedkv.errors import KVCacheRuntimeError, NoFreeBlocksError
from pagedkv.runtime import BlockPool, Request
from pagedkv.runtime.free_queue import FreeQueue, LRUFreeQueue
from pagedkv.runtime.hashing import BlockHasher

from .helpers import cached_blocks


def test_lru_queue_starts_in_id_order_without_the_null_block() -> None:
    queue = LRUFreeQueue(6)
    assert queue.order() == [1, 2, 3, 4, 5] and len(queue) == 5


def test_uncached_go_to_the_head_cached_to_the_tail() -> None:
    queue = LRUFreeQueue(10)
    (a, b, c, d), _ = queue.pop(4)
    queue.push_cached([c, d], priority=0)
    queue.push_uncached([a, b], priority=0)
    assert queue.order() == [a, b, 5, 6, 7, 8, 9, c, d]
    assert queue.pop(2)[0] == [a, b]


def test_evict_first_goes_before_every_other_cached_block() -> None:
    queue = LRUFreeQueue(6)
    blocks, _ = queue.pop(5)
    queue.push_cached(blocks[:2], 0)
    queue.push_cached(blocks[2:4], 0, evict_first=True)
    assert queue.order() == [blocks[2], blocks[3], blocks[0], blocks[1]]


@given(st.lists(st.integers(0, 3), min_size=1, max_size=40), st.data())
def test_remove_and_pop_undone_in_reverse_restore_the_exact_order(
    ops: list[int], data: st.DataObject
) -> None:
    queue = LRUFreeQueue(12)
    taken, _ = queue.pop(11)
    queue.push_cached(taken[:6], 0)
    queue.push_uncached(taken[6:9], 0)
    queue.push_cached(taken[9:], 0, evict_first=True)
    held = []
    before = queue.order()
    undo: list[tuple[str, Any]] = []
    for op in ops:
        free = queue.order()
        if op == 0 and free:
            n = data.draw(st.integers(1, len(free)))
            blocks, token = queue.pop(n)
            assert blocks == free[:n]
            undo.append(("pop", (blocks, token)))
            held += blocks
        elif op == 1 and queue.cached_order():
            block = data.draw(st.sampled_from(list(queue.cached_order())))
            undo.append(("remove", (block, queue.remove(block))))
        assert len(queue) == len(queue.order())
    for kind, arg in reversed(undo):
        if kind == "pop":
            queue.unpop(*arg)
        else:
            queue.reinsert(*arg)
    assert queue.order() == before and len(queue) == len(before)


def test_removing_a_block_outside_the_pool_is_refused_and_changes_nothing() -> None:
    queue = LRUFreeQueue(6)
    blocks, _ = queue.pop(3)
    queue.push_cached(blocks, 0)
    before = queue.order()
    with pytest.raises(KVCacheRuntimeError, match="outside the pool"):
        queue.remove_many([blocks[0], 99])
    with pytest.raises(KVCacheRuntimeError, match="outside the pool"):
        queue.remove(99)
    assert queue.order() == before and len(queue) == 5


class FIFOQueue(FreeQueue):
    """A deliberately different order: every freed block to the tail."""

    def __init__(self, num_blocks: int) -> None:
        self.blocks = list(range(1, num_blocks))

    def __len__(self) -> int:
        return len(self.blocks)

    def pop(self, num_blocks: int) -> tuple[list[int], Any]:
        out = self.blocks[:num_blocks]
        del self.blocks[:num_blocks]
        return out, None

    def unpop(self, blocks: list[int], token: Any) -> None:
        self.blocks[:0] = blocks

    def push_uncached(self, blocks: Sequence[int], priority: int) -> None:
        self.blocks.extend(blocks)

    def push_cached(self, blocks: Sequence[int], priority: int, evict_first: bool = False) -> None:
        self.blocks.extend(blocks)

    def remove(self, block: int) -> Any:
        index = self.blocks.index(block)
        del self.blocks[index]
        return index

    def reinsert(self, block: int, token: Any) -> None:
        self.blocks.insert(token, block)

    def order(self) -> list[int]:
        return list(self.blocks)


def test_pool_uses_the_given_queue_and_rolls_it_back() -> None:
    pool = BlockPool(6, hash_block_size=4, free_queue=FIFOQueue(6))
    a, b = pool.get_new_blocks(2)
    pool.free_blocks([b, a])
    assert pool.queue.order() == [3, 4, 5, b, a]
    before = pool.queue.order()
    savepoint = pool.begin()
    pool.get_new_blocks(4)
    pool.rollback(savepoint)
    assert pool.queue.order() == before


def test_pool_rejects_a_queue_of_the_wrong_size() -> None:
    with pytest.raises(Exception, match="free queue holds"):
        BlockPool(6, free_queue=FIFOQueue(4))


def test_rollback_restores_a_free_block_whose_hash_was_evicted() -> None:
    # The leak of issue 10: a cached free block whose hash evict_blocks dropped still sits
    # in the cached part; an allocation that pops it and then fails must put it back.
    pool = BlockPool(6, hash_block_size=4)
    blocks = pool.get_new_blocks(5)
    req = Request("r", list(range(20)), hasher=BlockHasher(4))
    pool.cache_full_blocks(req, blocks, 0, 5, 4, 0)
    pool.free_blocks(blocks)
    pool.evict_blocks([blocks[0]])
    before = (pool.queue.order(), cached_blocks(pool), list(pool.ref_cnt))
    savepoint = pool.begin()
    pool.touch([blocks[3]])
    pool.get_new_blocks(4)
    pool.rollback(savepoint)
    assert (pool.queue.order(), cached_blocks(pool), list(pool.ref_cnt)) == before
    with pytest.raises(NoFreeBlocksError):
        pool.get_new_blocks(6)


class CountingQueue(FIFOQueue):
    wants_hits = True

    def __init__(self, num_blocks: int) -> None:
        super().__init__(num_blocks)
        self.hits: dict[int, int] = {}

    def hit(self, block: int) -> None:
        self.hits[block] = self.hits.get(block, 0) + 1


def test_hits_reach_a_queue_that_wants_them_once_the_allocation_commits() -> None:
    queue = CountingQueue(8)
    pool = BlockPool(8, hash_block_size=4, free_queue=queue)
    blocks = pool.get_new_blocks(2)
    req = Request("r", list(range(8)), hasher=BlockHasher(4))
    pool.cache_full_blocks(req, blocks, 0, 2, 4, 0)
    pool.free_blocks(blocks)
    pool.touch(blocks[:1])
    assert queue.hits == {blocks[0]: 1}
    savepoint = pool.begin()
    pool.touch(blocks)
    assert queue.hits == {blocks[0]: 1}  # reported at the commit
    pool.rollback(savepoint)
    assert queue.hits == {blocks[0]: 1}
    pool.free_blocks(blocks[:1])
    pool.begin()
    pool.touch(blocks)
    pool.commit()
    assert queue.hits == {blocks[0]: 2, blocks[1]: 1}


class ListModel:
    """The free list as vLLM keeps it: one list, head first; cached blocks form its tail."""

    def __init__(self, num_blocks: int) -> None:
        self.order = list(range(1, num_blocks))
        self.cached: set[int] = set()

    def pop(self, n: int) -> list[int]:
        out, self.order = self.order[:n], self.order[n:]
        self.cached.difference_update(out)
        return out

    def push_uncached(self, blocks: list[int]) -> None:
        self.order[:0] = blocks

    def push_cached(self, blocks: list[int], evict_first: bool) -> None:
        if evict_first:
            at = next((i for i, b in enumerate(self.order) if b in self.cached), len(self.order))
            self.order[at:at] = blocks
        else:
            self.order += blocks
        self.cached.update(blocks)

    def remove(self, block: int) -> None:
        self.order.remove(block)
        self.cached.discard(block)


def _queue_op(queue: LRUFreeQueue, model: ListModel, held: list[int], data: st.DataObject) -> Any:
    """One random operation on both; returns its undo for pop/remove, else None."""
    op = data.draw(st.sampled_from(["pop", "pop_one", "remove", "push_uncached", "push_cached"]))
    if op == "pop_one" and model.order:  # never undone: it ends a transaction, as a push
        block = queue.pop_one()
        assert [block] == model.pop(1)
        held.append(block)
        return None
    if op == "pop" and model.order:
        n = data.draw(st.integers(1, len(model.order)))
        blocks, token = queue.pop(n)
        assert blocks == model.pop(n)
        held += blocks
        return ("pop", blocks, token)
    if op == "remove" and model.order:
        block = data.draw(st.sampled_from(model.order))
        token = queue.remove(block)
        model.remove(block)
        held.append(block)
        return ("remove", block, token)
    if op.startswith("push") and held:
        blocks = data.draw(st.lists(st.sampled_from(held), min_size=1, unique=True))
        for block in blocks:
            held.remove(block)
        if op == "push_uncached":
            queue.push_uncached(blocks, 0)
            model.push_uncached(blocks)
        else:
            evict_first = data.draw(st.booleans())
            queue.push_cached(blocks, 0, evict_first)
            model.push_cached(blocks, evict_first)
    return None


@given(st.data())
@pytest.mark.slow
def test_any_free_block_can_be_removed_and_every_change_undone(data: st.DataObject) -> None:
    # vLLM's free list lets a hit take any free block (cached, freed uncached or never
    # used); the queue must match a plain list and undo pops and removes exactly.
    queue, model, held = LRUFreeQueue(10), ListModel(10), []
    for _ in range(data.draw(st.integers(0, 25))):
        _queue_op(queue, model, held, data)
        assert queue.order() == model.order and len(queue) == len(model.order)
    before = queue.order()
    undo = []
    for _ in range(data.draw(st.integers(0, 10))):
        step = _queue_op(queue, model, held, data)
        if step is None:
            break  # a push has no undo: the transaction ends
        undo.append(step)
        assert queue.order() == model.order and len(queue) == len(model.order)
    else:
        for kind, blocks, token in reversed(undo):
            if kind == "pop":
                queue.unpop(blocks, token)
            else:
                queue.reinsert(blocks, token)
        assert queue.order() == before and len(queue) == len(before)


def test_a_hit_on_uncached_free_blocks_takes_them_out_of_the_pool_until_rollback() -> None:
    pool = BlockPool(8, hash_block_size=4)
    a, b, c = pool.get_new_blocks(3)
    pool.free_blocks([a, b, c])  # uncached: a, b, c at the head, then 4 .. 7
    savepoint = pool.begin()
    pool.touch([b, 5])
    assert pool.ref_cnt[b] == pool.ref_cnt[5] == 1 and pool.num_free_blocks == 5
    assert pool.get_new_blocks(5) == [a, c, 4, 6, 7]
    pool.rollback(savepoint)
    assert pool.queue.order() == [a, b, c, 4, 5, 6, 7] and pool.ref_cnt[b] == 0


@pytest.mark.parametrize("policy", ["lru", "lfu"])
def test_a_block_touched_twice_in_one_call_leaves_the_queue_once(policy: str) -> None:
    from pagedkv.policies import make_free_queue

    pool = BlockPool(8, hash_block_size=4, free_queue=make_free_queue(policy, 8))
    a, b = pool.get_new_blocks(2)
    req = Request("r", list(range(8)), hasher=BlockHasher(4))
    pool.cache_full_blocks(req, [a], 0, 1, 4, 0)
    pool.free_blocks([a, b])  # a cached (tail), b uncached (head)
    before = pool.queue.order()
    savepoint = pool.begin()
    pool.touch([a, b, 4, a, b, 4])
    assert [pool.ref_cnt[x] for x in (a, b, 4)] == [2, 2, 2] and pool.num_free_blocks == 4
    assert pool.queue.order() == [3, 5, 6, 7]
    pool.rollback(savepoint)
    assert pool.queue.order() == before and pool.num_free_blocks == 7


def test_a_policy_queue_takes_uncached_hits_from_its_uncached_part() -> None:
    from pagedkv.policies import make_free_queue

    queue = make_free_queue("lfu", 8)
    blocks, _ = queue.pop(3)
    queue.push_cached(blocks[:1], 0)
    queue.push_uncached(blocks[1:], 0)
    before = queue.order()
    taken = [blocks[2], 5, blocks[0]]
    tokens = queue.remove_many(taken)
    assert queue.order() == [blocks[1], 4, 6, 7] and len(queue) == 4
    for block, token in zip(reversed(taken), reversed(tokens)):
        queue.reinsert(block, token)
    assert queue.order() == before


def test_a_subclass_that_overrides_pop_sees_a_decode_steps_pop() -> None:
    class Counting(LRUFreeQueue):
        def __init__(self, num_blocks: int) -> None:
            super().__init__(num_blocks)
            self.popped: list[int] = []

        def pop(self, num_blocks: int) -> tuple[list[int], Any]:
            blocks, token = super().pop(num_blocks)
            self.popped += blocks
            return blocks, token

    queue = Counting(8)
    assert queue.pop_one() == 1 and queue.popped == [1]
    assert LRUFreeQueue(8).pop_one() == 1  # the built-in queue's own path
