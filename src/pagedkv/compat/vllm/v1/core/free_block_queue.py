"""vLLM's ``FreeKVCacheBlockQueue`` over pagedkv's ``LRUFreeQueue``.

vLLM keeps free blocks in a doubly linked list threaded through the blocks
(``prev_free_block`` / ``next_free_block``) between two sentinel ends. Here the order
lives in a pagedkv ``LRUFreeQueue`` of block ids; a queued block's links are read from
that order, and the sentinel ends hold the two links the queue maintains at its ends.
Reading a link walks the order (O(n)): this queue stands alone, for callers that build
one from their own blocks, and a pool's free queue is never one of these.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from pagedkv.runtime.free_queue import LRUFreeQueue

__all__ = ["FreeKVCacheBlockQueue", "FreeListEnd"]


class KVCacheBlock(Protocol):
    """What the queue reads and sets on a block (``kv_cache_utils.KVCacheBlock``)."""

    block_id: int
    _free_queue: Any


class FreeListEnd:
    """A sentinel end of the list (vLLM's ``fake_free_list_head`` / ``_tail``): the
    queue sets its link after every change; a link written by hand stays until then."""

    __slots__ = ("block_id", "next_free_block", "prev_free_block")

    def __init__(self) -> None:
        self.block_id = -1
        self.prev_free_block: Any = None
        self.next_free_block: Any = None

    def __repr__(self) -> str:
        return "FreeListEnd()"


class FreeKVCacheBlockQueue:
    """Free blocks in hand-out order: ``popleft`` takes the head, ``append`` adds at the
    tail, ``prepend_n`` at the head, ``remove`` takes one from anywhere."""

    def __init__(self, blocks: Sequence[KVCacheBlock]) -> None:
        # Every id sits in the queue's LRU part (no never-used part: one block, the null).
        self._order = LRUFreeQueue(1)
        self._blocks: dict[int, KVCacheBlock] = {}
        self.fake_free_list_head = FreeListEnd()
        self.fake_free_list_tail = FreeListEnd()
        self._enqueue(blocks, at_head=False)

    @property
    def num_free_blocks(self) -> int:
        return len(self._order)

    def popleft(self) -> KVCacheBlock:
        if not self._blocks:
            raise ValueError("No free blocks available")
        return self.popleft_n(1)[0]

    def popleft_n(self, n: int) -> list[KVCacheBlock]:
        if n > self.num_free_blocks:
            raise AssertionError(f"popleft_n({n}) with {self.num_free_blocks} free blocks")
        if n == 0:
            return []
        block_ids, _ = self._order.pop(n)
        popped = [self._blocks.pop(b) for b in block_ids]
        for block in popped:
            block._free_queue = None
        self._link_ends()
        return popped

    def remove(self, block: KVCacheBlock) -> None:
        if self._blocks.get(block.block_id) is not block:
            raise RuntimeError(f"remove() called on an invalid block: {block}")
        self._order.remove(block.block_id)
        del self._blocks[block.block_id]
        block._free_queue = None
        self._link_ends()

    def append(self, block: KVCacheBlock) -> None:
        if self.fake_free_list_tail.prev_free_block is None:
            raise RuntimeError("prev_free_block of fake_free_list_tail should always exist")
        self._enqueue([block], at_head=False)

    def append_n(self, blocks: Sequence[KVCacheBlock]) -> None:
        if not blocks:
            return
        if self.fake_free_list_tail.prev_free_block is None:
            raise AssertionError("prev_free_block of fake_free_list_tail should always exist")
        self._enqueue(blocks, at_head=False)

    def prepend_n(self, blocks: Sequence[KVCacheBlock]) -> None:
        if not blocks:
            return
        if self.fake_free_list_head.next_free_block is None:
            raise AssertionError("next_free_block of fake_free_list_head should always exist")
        self._enqueue(blocks, at_head=True)

    def get_all_free_blocks(self) -> list[KVCacheBlock]:
        return [self._blocks[b] for b in self._order.order()]

    def neighbour(self, block: KVCacheBlock, after: bool) -> Any:
        """The block (or sentinel end) after / before a queued ``block``."""
        order = self._order.order()
        i = order.index(block.block_id) + (1 if after else -1)
        if i < 0:
            return self.fake_free_list_head
        if i == len(order):
            return self.fake_free_list_tail
        return self._blocks[order[i]]

    def _enqueue(self, blocks: Iterable[KVCacheBlock], at_head: bool) -> None:
        blocks = list(blocks)
        ids = [block.block_id for block in blocks]
        for block in blocks:
            if block._free_queue is not None or block.block_id in self._blocks:
                raise ValueError(f"{block} is already in a free block queue")
        if len(set(ids)) != len(ids):
            raise ValueError(f"blocks to queue repeat a block id: {ids}")
        if ids:
            self._order.reserve_ids(max(ids) + 1)
        self._order.push_cached(ids, priority=0, evict_first=at_head)
        for block in blocks:
            block._free_queue = self
            self._blocks[block.block_id] = block
        self._link_ends()

    def _link_ends(self) -> None:
        head, tail = self.fake_free_list_head, self.fake_free_list_tail
        order = self._order.order()
        head.next_free_block = self._blocks[order[0]] if order else tail
        tail.prev_free_block = self._blocks[order[-1]] if order else head
