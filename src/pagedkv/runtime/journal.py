"""Undo journal of the block pool: lets a failed allocation leave the pool as it was.

While a transaction is open the pool appends one entry per change:
``("new", blocks, num_from_stack, num_fresh, evicted)`` for ``get_new_blocks``
(``evicted``: ``(block, hash, group id)`` of cached blocks it handed out),
``("touch", blocks)`` and ``("cache", blocks)``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from pagedkv.runtime.block_pool import BlockPool

Journal = list[tuple[Any, ...]]


class Savepoint(NamedTuple):
    """Where the pool was when a transaction began (see ``BlockPool.begin``)."""

    num_events: int


def undo(pool: BlockPool, journal: Journal) -> None:
    """Revert the journaled changes, newest first.

    New blocks go back where they came from (cached ones with their hash, at the head of
    the cached part); hashes given are taken back; touched blocks are released, a revived
    cached block returning to the tail of the queue (its old position is not kept).
    """
    ref = pool.ref_cnt
    for entry in reversed(journal):
        kind = entry[0]
        if kind == "new":
            _undo_new(pool, entry[1], entry[2], entry[3], entry[4])
        elif kind == "touch":
            for block in entry[1]:
                ref[block] -= 1
                if ref[block] == 0:
                    pool._lru[block] = None
        else:  # "cache"
            for block in entry[1]:
                h = pool.block_hash[block]
                if h is not None:
                    pool._drop_key(block, h, pool.block_group[block])


def _undo_new(
    pool: BlockPool,
    blocks: list[int],
    from_stack: int,
    fresh: int,
    evicted: list[tuple[int, Any, int]],
) -> None:
    for block in blocks:
        pool.ref_cnt[block] = 0
    lru = pool._lru
    pool.num_evictions -= len(evicted)
    for block, h, gid in reversed(evicted):
        pool._restore_key(block, h, gid)
        lru[block] = None
        lru.move_to_end(block, last=False)
    if fresh:
        pool._next_fresh -= fresh
    pool._stack.extend(reversed(blocks[:from_stack]))
