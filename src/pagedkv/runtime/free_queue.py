"""The free queue: the order in which the block pool hands out (and evicts) free blocks.

A rolled-back allocation calls ``unpop`` / ``reinsert`` newest first, so each undo sees the
queue as it was right after the call it undoes; frees never happen inside an allocation.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Sequence
from itertools import islice
from typing import Any, ClassVar

__all__ = [
    "FreeQueue",
    "LRUFreeQueue",
]


class FreeQueue(ABC):
    """Eviction order of a pool's free blocks (never block 0), built all free in id order."""

    wants_hits: ClassVar[bool] = False

    @abstractmethod
    def __len__(self) -> int: ...

    @abstractmethod
    def pop(self, num_blocks: int) -> tuple[list[int], Any]:
        """Take ``num_blocks`` blocks from the head; returns them and a token for ``unpop``."""

    @abstractmethod
    def unpop(self, blocks: list[int], token: Any) -> None:
        """Undo of ``pop``: ``blocks`` back at the head, ``blocks[0]`` first."""

    @abstractmethod
    def push_uncached(self, blocks: Sequence[int], priority: int) -> None:
        """Freed blocks without a hash, ``blocks[0]`` handed out first among them."""

    @abstractmethod
    def push_cached(self, blocks: Sequence[int], priority: int, evict_first: bool = False) -> None:
        """Freed blocks that keep their hash, ``blocks[0]`` evicted first among them
        (``evict_first``: before every other cached block)."""

    @abstractmethod
    def remove(self, block: int) -> Any:
        """Take a free block out of the queue (a cache hit); returns a position token."""

    def remove_many(self, blocks: Sequence[int]) -> list[Any]:
        """``remove`` of each block in order (one call per touch; override to batch)."""
        return [self.remove(block) for block in blocks]

    @abstractmethod
    def reinsert(self, block: int, token: Any) -> None:
        """Undo of ``remove``: ``block`` back at the position ``token`` records."""

    def hit(self, block: int) -> None:  # noqa: B027 - optional hook
        """A cache hit on ``block`` (free or in use); called only if ``wants_hits``."""

    def unhit(self, block: int) -> None:  # noqa: B027 - optional hook
        """Undo of ``hit`` (a rolled-back allocation); called only if ``wants_hits``."""

    @abstractmethod
    def order(self) -> list[int]:
        """Every free block, head (next handed out) first."""


class LRUFreeQueue(FreeQueue):
    """vLLM's order: freed uncached blocks at the head (LIFO), freed cached ones at the
    tail (LRU). Three parts concatenate to vLLM's one list: ``_stack`` (head at its end),
    the never-used ids ``[_next_fresh, num_blocks)`` and ``_lru`` (block -> sequence)."""

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self._stack: list[int] = []
        self._next_fresh = 1  # block 0 is the null block
        self._lru: OrderedDict[int, int] = OrderedDict()
        self._seq = 0  # next tail sequence number
        self._front_seq = 0  # sequence numbers below every other (evict_first)

    def __len__(self) -> int:
        return len(self._stack) + self.num_blocks - self._next_fresh + len(self._lru)

    def pop(self, num_blocks: int) -> tuple[list[int], Any]:
        stack = self._stack
        if num_blocks <= len(stack):  # token None: all from the stack
            if num_blocks == 1:
                return [stack.pop()], None
            blocks = stack[len(stack) - num_blocks :]
            del stack[len(stack) - num_blocks :]
            blocks.reverse()
            return blocks, None
        blocks = stack[::-1]
        stack.clear()
        rest = num_blocks - len(blocks)
        fresh = min(rest, self.num_blocks - self._next_fresh)
        if fresh:
            blocks.extend(range(self._next_fresh, self._next_fresh + fresh))
            self._next_fresh += fresh
            rest -= fresh
        lru = self._lru
        taken = list(islice(lru, rest))
        seqs = list(map(lru.pop, taken))
        blocks += taken
        return blocks, (fresh, seqs)

    def unpop(self, blocks: list[int], token: Any) -> None:
        if token is None:
            self._stack.extend(reversed(blocks))
            return
        fresh, seqs = token
        lru = self._lru
        tail = len(blocks) - len(seqs)
        for block, seq in zip(reversed(blocks[tail:]), reversed(seqs)):
            lru[block] = seq
            lru.move_to_end(block, last=False)
        self._next_fresh -= fresh
        self._stack.extend(reversed(blocks[: tail - fresh]))

    def push_uncached(self, blocks: Sequence[int], priority: int) -> None:
        self._stack.extend(reversed(blocks))

    def push_cached(self, blocks: Sequence[int], priority: int, evict_first: bool = False) -> None:
        lru = self._lru
        if not evict_first:
            seq = self._seq
            for block in blocks:
                lru[block] = seq
                seq += 1
            self._seq = seq
            return
        move = lru.move_to_end
        for block in reversed(blocks):
            self._front_seq -= 1
            lru[block] = self._front_seq
            move(block, last=False)

    def remove(self, block: int) -> Any:
        return self._lru.pop(block)  # only cached blocks are hit; they are in the LRU part

    def remove_many(self, blocks: Sequence[int]) -> list[Any]:
        return list(map(self._lru.pop, blocks))

    def reinsert(self, block: int, token: Any) -> None:
        lru = self._lru
        if not lru or next(reversed(lru.values())) < token:
            lru[block] = token
            return
        lru[block] = token
        if next(iter(lru.values())) > token:
            lru.move_to_end(block, last=False)
            return
        for later in [b for b, seq in lru.items() if seq > token]:
            lru.move_to_end(later)

    def order(self) -> list[int]:
        return [*reversed(self._stack), *range(self._next_fresh, self.num_blocks), *self._lru]
