"""The block pool: block ids, reference counts, the free queue and the prefix-cache hash map.

Blocks are plain integer ids ``0 .. num_blocks - 1``; block 0 is the permanent null
block (placeholder for positions a request does not need). Per-block state lives in three
flat lists (reference count, block hash, group id), so a fresh pool of millions of blocks
costs 24 bytes per block and builds in milliseconds; a cached block adds its map entries.

The order of free blocks is the ``FreeQueue``'s (free_queue.py; vLLM's LRU by default).
Which cached block holds which hash is kept by ``PrefixCacheIndex`` (prefix_cache.py).

Transactions: between ``begin`` and ``commit`` the pool journals every change
(``("pop", blocks, evicted, token)``, ``("touch", [(block, token)])``, ``("cache", blocks)``
and the managers' ``("call", undo, args)``, see ``record``);
``rollback`` undoes them newest first, so the free blocks, their order, the reference
counts and the hash map are exactly as at ``begin``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

from pagedkv.errors import KVCacheRuntimeError, NoFreeBlocksError
from pagedkv.runtime.events import AllBlocksCleared, KVCacheEvent
from pagedkv.runtime.free_queue import FreeQueue, LRUFreeQueue
from pagedkv.runtime.prefix_cache import NULL_BLOCK, PrefixCacheIndex

__all__ = ["NULL_BLOCK", "BlockPool", "Savepoint"]


class Savepoint(NamedTuple):
    """Where the pool was when a transaction began (see ``BlockPool.begin``)."""

    num_events: int


class BlockPool(PrefixCacheIndex):
    """Fixed set of KV cache blocks shared by every group of a model.

    ``hash_block_size``: token granularity of the requests' hash chains (None: every
    group's block size, i.e. block ``i`` uses hash ``i``). ``free_queue``: the eviction
    order (default: vLLM's, ``LRUFreeQueue``), built for ``num_blocks``.
    """

    def __init__(
        self,
        num_blocks: int,
        enable_caching: bool = True,
        hash_block_size: int | None = None,
        enable_events: bool = False,
        medium: str = "GPU",
        free_queue: FreeQueue | None = None,
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
        self.queue = LRUFreeQueue(num_blocks) if free_queue is None else free_queue
        if len(self.queue) != num_blocks - 1:
            raise KVCacheRuntimeError(
                f"BlockPool: the free queue holds {len(self.queue)} blocks, expected "
                f"{num_blocks - 1} (every block but the null block)"
            )
        self._queue_hits = self.queue.wants_hits
        self._maps: list[dict[Any, int]] = []
        self._dups: list[dict[Any, list[int]]] = []
        self._events: list[KVCacheEvent] | None = [] if enable_events else None
        self.event_token_ids = True  # False: BlockStored events carry no token ids
        self._journal: list[tuple[Any, ...]] | None = None
        # Cached blocks whose hash was dropped to reuse them (or by evict_blocks): one
        # BlockRemoved event each when events are on.
        self.num_evictions = 0

    # ----------------------------------------------------------------- queries
    @property
    def num_free_blocks(self) -> int:
        return len(self.queue)

    def get_num_free_blocks(self) -> int:
        return len(self.queue)

    @property
    def usage(self) -> float:
        """Fraction of usable (non-null) blocks in use."""
        usable = self.num_blocks - 1
        return 0.0 if usable == 0 else 1.0 - len(self.queue) / usable

    def free_queue(self) -> list[int]:
        """All free blocks in the order they would be handed out (for tests and tools)."""
        return self.queue.order()

    # ------------------------------------------------------------- allocation
    def get_new_blocks(self, num_blocks: int) -> list[int]:
        """Pop ``num_blocks`` blocks from the head of the free queue, each with ref count 1.

        Cached blocks handed out lose their hash (one BlockRemoved event each).
        NoFreeBlocksError, with nothing changed, if fewer are free.
        """
        if num_blocks <= 0:
            return []
        queue = self.queue
        if num_blocks > len(queue):
            raise NoFreeBlocksError(
                f"cannot get {num_blocks} free blocks from the pool ({len(queue)} free)"
            )
        blocks, token = queue.pop(num_blocks)
        ref = self.ref_cnt
        hashes = self.block_hash
        evicted: list[tuple[int, Any, int, int]] = []
        for block in blocks:
            ref[block] = 1
            h = hashes[block]
            if h is not None:
                gid = self.block_group[block]
                evicted.append((block, h, gid, self._drop_key(block, h, gid)))
        if evicted:
            self.num_evictions += len(evicted)
        if self._journal is not None:
            self._journal.append(("pop", blocks, evicted, token))
        return blocks

    def touch(self, blocks: Iterable[int]) -> None:
        """Take one more reference on each (non-null) block; free ones leave the queue."""
        ref = self.ref_cnt
        remove = self.queue.remove
        touched = []
        for block in blocks:
            if block:
                token = remove(block) if ref[block] == 0 else None
                ref[block] += 1
                touched.append((block, token))
                if self._queue_hits:
                    self.queue.hit(block)
        if self._journal is not None:
            self._journal.append(("touch", touched))

    def free_blocks(
        self, ordered_blocks: Iterable[int], priority: int = 0, evict_first: bool = False
    ) -> None:
        """Drop one reference on each block; the first given is evicted first.

        Blocks reaching zero without a hash go to the queue's uncached side (vLLM: the
        head, reused next); cached ones to its cached side (vLLM: the tail). ``priority``
        is the freeing request's; ``evict_first`` asks the queue to evict these cached
        blocks before the others (the opt-in dense retention).
        """
        ref = self.ref_cnt
        hashes = self.block_hash
        caching = self.enable_caching
        uncached = []
        cached = []
        for block in ordered_blocks:
            if block:
                count = ref[block] - 1
                ref[block] = count
                if count == 0:
                    if caching and hashes[block] is not None:
                        cached.append(block)
                    else:
                        uncached.append(block)
        if uncached:
            self.queue.push_uncached(uncached, priority)
        if cached:
            self.queue.push_cached(cached, priority, evict_first)

    def reset_prefix_cache(self) -> bool:
        """Forget every cached hash; refused (False) while any block is in use. The free
        queue keeps its order."""
        if len(self.queue) != self.num_blocks - 1:
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

    def record(self, undo: Callable[..., object], *args: Any) -> None:
        """Inside a transaction: call ``undo(*args)`` on rollback (managers journal their
        table changes here, so one rollback restores pool and tables together)."""
        if self._journal is not None:
            self._journal.append(("call", undo, args))

    def rollback(self, savepoint: Savepoint) -> None:
        """Undo everything since ``begin``, newest first: popped blocks go back to the
        head of the queue with their hash and map position, touched ones are released
        (free ones back at their queue position), hashes given are taken back."""
        journal = self._journal or []
        self._journal = None
        ref = self.ref_cnt
        queue = self.queue
        for entry in reversed(journal):
            kind = entry[0]
            if kind == "pop":
                for block, h, gid, index in reversed(entry[2]):
                    self._restore_key(block, h, gid, index)
                self.num_evictions -= len(entry[2])
                for block in entry[1]:
                    ref[block] = 0
                queue.unpop(entry[1], entry[3])
            elif kind == "touch":
                for block, token in reversed(entry[1]):
                    ref[block] -= 1
                    if token is not None:
                        queue.reinsert(block, token)
            elif kind == "call":
                entry[1](*entry[2])
            else:  # "cache"
                for block in reversed(entry[1]):
                    self._drop_key(block, self.block_hash[block], self.block_group[block])
        if self._events is not None:
            del self._events[savepoint.num_events :]
