"""The block pool: block ids, reference counts, the free queue and the prefix-cache hash map.

Blocks are plain integer ids ``0 .. num_blocks - 1``; block 0 is the permanent null
block (placeholder for positions a request does not need). Per-block state lives in three
flat lists (reference count, block hash, group id), so a pool of millions of blocks costs
24 bytes per block and builds in milliseconds; a cached block adds its map entries.

The free queue (head = next block handed out) is kept in three parts, which together
give exactly the order of one doubly linked list:

1. ``_stack``: freed blocks without a hash, most recently freed at the head (LIFO reuse);
2. the fresh range ``[_next_fresh, num_blocks)``: never-used blocks in id order;
3. ``_lru``: freed blocks that were cached, least recently used first (O(1) removal
   from the middle when a cache hit revives one).

Which cached block holds which hash is kept by ``PrefixCacheIndex`` (prefix_cache.py).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

from pagedkv.errors import KVCacheRuntimeError, NoFreeBlocksError
from pagedkv.runtime.events import AllBlocksCleared, BlockRemoved, KVCacheEvent
from pagedkv.runtime.journal import Journal, Savepoint, undo
from pagedkv.runtime.prefix_cache import NULL_BLOCK, PrefixCacheIndex

__all__ = ["NULL_BLOCK", "BlockPool"]


class BlockPool(PrefixCacheIndex):
    """Fixed set of KV cache blocks shared by every group of a model.

    ``hash_block_size``: token granularity of the requests' hash chains (None: every
    group's block size, i.e. block ``i`` uses hash ``i``).
    """

    def __init__(
        self,
        num_blocks: int,
        enable_caching: bool = True,
        hash_block_size: int | None = None,
        enable_events: bool = False,
        medium: str = "GPU",
    ) -> None:
        if not isinstance(num_blocks, int) or isinstance(num_blocks, bool) or num_blocks < 1:
            raise KVCacheRuntimeError(
                f"BlockPool.num_blocks must be a positive integer, got {num_blocks!r}"
            )
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.hash_block_size = hash_block_size
        self.medium = medium
        self.ref_cnt: list[int] = [0] * num_blocks
        self.block_hash: list[Any] = [None] * num_blocks  # None: not cached
        self.block_group: list[int] = [0] * num_blocks  # group of the cached hash
        self._stack: list[int] = []
        self._next_fresh = 1  # block 0 is the null block, never free
        self._lru: OrderedDict[int, None] = OrderedDict()
        self._maps: list[dict[Any, int]] = []
        self._dups: list[dict[Any, list[int]]] = []
        self._events: list[KVCacheEvent] | None = [] if enable_events else None
        self._journal: Journal | None = None
        # Cached blocks whose hash was dropped to reuse them (or by evict_blocks): one
        # BlockRemoved event each when events are on.
        self.num_evictions = 0
        # Blocks cached in the current step whose content the engine has not written yet
        # (block -> request that caches it). A kind that needs complete content at
        # admission (state checkpoints) cannot adopt them until they are written: at the
        # caching request's next allocation or free, or at the next engine step.
        self.unwritten_blocks: dict[int, str] = {}
        self._unwritten_by_request: dict[str, list[int]] = {}

    # ----------------------------------------------------------------- queries
    @property
    def num_free_blocks(self) -> int:
        return len(self._stack) + self.num_blocks - self._next_fresh + len(self._lru)

    def get_num_free_blocks(self) -> int:
        return self.num_free_blocks

    @property
    def usage(self) -> float:
        """Fraction of usable (non-null) blocks in use."""
        usable = self.num_blocks - 1
        return 0.0 if usable == 0 else 1.0 - self.num_free_blocks / usable

    def free_queue(self) -> list[int]:
        """All free blocks in the order they would be handed out (for tests and tools)."""
        return [*reversed(self._stack), *range(self._next_fresh, self.num_blocks), *self._lru]

    # ------------------------------------------------------------- allocation
    def get_new_blocks(self, num_blocks: int) -> list[int]:
        """Pop ``num_blocks`` blocks from the head of the free queue, each with ref count 1.

        Cached blocks handed out lose their hash (one BlockRemoved event each).
        NoFreeBlocksError, with nothing changed, if fewer are free.
        """
        stack = self._stack
        if num_blocks <= len(stack):
            if num_blocks == 1:
                block = stack.pop()
                self.ref_cnt[block] = 1
                if self._journal is not None:
                    self._journal.append(("new", [block], 1, 0, ()))
                return [block]
            if num_blocks <= 0:
                return []
            blocks = stack[-num_blocks:]
            del stack[-num_blocks:]
            blocks.reverse()
            from_stack, fresh, evicted = num_blocks, 0, ()
        else:
            blocks, from_stack, fresh, evicted = self._get_new_blocks_slow(num_blocks)
        ref = self.ref_cnt
        for block in blocks:
            ref[block] = 1
        if self._journal is not None:
            self._journal.append(("new", blocks, from_stack, fresh, evicted))
        return blocks

    def _get_new_blocks_slow(self, num_blocks: int) -> tuple[list[int], int, int, Any]:
        free = self.num_free_blocks
        if num_blocks > free:
            raise NoFreeBlocksError(
                f"cannot get {num_blocks} free blocks from the pool ({free} free)"
            )
        stack = self._stack
        blocks = stack[::-1]
        from_stack = len(blocks)
        stack.clear()
        rest = num_blocks - from_stack
        fresh = min(rest, self.num_blocks - self._next_fresh)
        if fresh:
            blocks.extend(range(self._next_fresh, self._next_fresh + fresh))
            self._next_fresh += fresh
            rest -= fresh
        evicted: list[tuple[int, Any, int]] = []
        popitem = self._lru.popitem
        hashes = self.block_hash
        groups = self.block_group
        maps = self._maps
        dups = self._dups
        events = self._events
        medium = self.medium
        journal = self._journal is not None
        num_evicted = 0
        for _ in range(rest):
            block = popitem(last=False)[0]
            h = hashes[block]
            if h is not None:
                num_evicted += 1
                gid = groups[block]
                if journal:
                    evicted.append((block, h, gid))
                if h not in dups[gid]:  # the only block with this key
                    hashes[block] = None
                    del maps[gid][h]
                    if events is not None:
                        events.append(BlockRemoved([h], medium, gid))
                else:
                    self._drop_key(block, h, gid)
            blocks.append(block)
        self.num_evictions += num_evicted
        return blocks, from_stack, fresh, evicted

    def touch(self, blocks: Iterable[int]) -> None:
        """Take one more reference on each (non-null) block; free ones leave the queue."""
        ref = self.ref_cnt
        lru = self._lru
        touched = []
        for block in blocks:
            if block:
                if ref[block] == 0:
                    del lru[block]
                ref[block] += 1
                touched.append(block)
        if self._journal is not None:
            self._journal.append(("touch", touched))

    def free_blocks(self, ordered_blocks: Iterable[int], evict_early: bool = False) -> None:
        """Drop one reference on each block; the first given is evicted first.

        Blocks reaching zero without a hash go to the head of the queue (reused next,
        while their memory is warm); cached ones go to the tail (least recently used),
        or with ``evict_early`` to the front of the cached part (evicted before every
        other cached block, still reusable until then).
        """
        ref = self.ref_cnt
        hashes = self.block_hash
        lru = self._lru
        caching = self.enable_caching
        uncached = []
        early = []
        for block in ordered_blocks:
            if block:
                count = ref[block] - 1
                ref[block] = count
                if count == 0:
                    if caching and hashes[block] is not None:
                        if evict_early:
                            early.append(block)
                        else:
                            lru[block] = None
                    else:
                        uncached.append(block)
        if uncached:
            uncached.reverse()
            self._stack.extend(uncached)
        if early:
            move = lru.move_to_end
            for block in reversed(early):
                lru[block] = None
                move(block, last=False)

    def reset_prefix_cache(self) -> bool:
        """Forget every cached hash; refused (False) while any block is in use."""
        if self.num_free_blocks != self.num_blocks - 1:
            return False
        self._maps = []
        self._dups = []
        self.block_hash = [None] * self.num_blocks
        if self._events is not None:
            self._events.append(AllBlocksCleared())
        return True

    def take_events(self) -> list[KVCacheEvent]:
        """Events since the last call (empty when events are disabled)."""
        events = self._events
        if not events:
            return []
        self._events = []
        return events

    # ------------------------------------------------------------ transactions
    def begin(self) -> Savepoint:
        """Start journaling changes so ``rollback`` can undo them."""
        self._journal = []
        return Savepoint(len(self._events) if self._events is not None else 0)

    def commit(self) -> None:
        self._journal = None

    def rollback(self, savepoint: Savepoint) -> None:
        """Undo everything since ``begin`` (see ``pagedkv.runtime.journal.undo``)."""
        journal = self._journal or []
        self._journal = None
        undo(self, journal)
        if self._events is not None:
            del self._events[savepoint.num_events :]
