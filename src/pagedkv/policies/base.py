"""EvictionPolicy: which free cached block of a pool is evicted next.

A policy orders only the *cached* free blocks (the pool keeps uncached free blocks and
never-used ones itself). The pool tells a policy of hits (``hit``) only once an
allocation commits and frees blocks only outside one, so the only calls a failed
allocation takes back are ``pop`` and ``remove``: each returns a token, and ``unpop`` /
``restore`` given that token put the policy back in the state it was in, provided undos
run newest first (as the pool's journal does). A policy that is a sort key subclasses
``HeapPolicy`` and defines ``level``; the heap carries the undo, so it writes none.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar

__all__ = [
    "EARLY_PRIORITY",
    "SEQ_BITS",
    "SEQ_MASK",
    "EvictionPolicy",
    "HitCounts",
]

EARLY_PRIORITY = -(2**62)  # below every request priority: freed "evict early" blocks
# Heap policies pack (level, sequence number) into one int: level << SEQ_BITS | sequence.
SEQ_BITS = 48
SEQ_MASK = (1 << SEQ_BITS) - 1


class EvictionPolicy(ABC):
    """Orders the free cached blocks of one pool; block ids are ``0 .. num_blocks - 1``."""

    name: ClassVar[str] = ""
    uses_keys: ClassVar[bool] = False  # push needs each block's key (a ghost list)

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks

    @abstractmethod
    def __len__(self) -> int:
        """Number of free cached blocks the policy holds."""

    @abstractmethod
    def push(self, block: int, priority: int = 0, key: Any = None) -> None:
        """``block`` (cached, content ``key``) became free; the freeing request had
        ``priority`` (higher is kept longer)."""

    def push_blocks(self, blocks: Sequence[int], priority: int, keys: Sequence[Any]) -> None:
        """``push`` each block in order (``keys`` empty unless ``uses_keys``)."""
        for i, block in enumerate(blocks):
            self.push(block, priority, keys[i] if keys else None)

    @abstractmethod
    def push_early(self, block: int, key: Any = None) -> None:
        """``block`` became free and should be evicted before the other cached blocks."""

    @abstractmethod
    def pop(self) -> tuple[int, Any]:
        """Remove and return the victim and a token that lets ``unpop`` undo everything
        this call changed (other blocks moved, ghost entries, counters); IndexError if
        empty."""

    def pop_blocks(self, count: int) -> tuple[list[int], list[Any]]:
        """``count`` pops: the victims in order and their undo tokens."""
        blocks = []
        tokens = []
        for _ in range(count):
            block, token = self.pop()
            blocks.append(block)
            tokens.append(token)
        return blocks, tokens

    @abstractmethod
    def unpop(self, block: int, token: Any) -> None:
        """Undo the ``pop`` that returned ``(block, token)``."""

    @abstractmethod
    def remove(self, block: int) -> Any:
        """``block`` was revived (a cache hit took a reference); returns a token recording
        where it was, for ``restore``."""

    @abstractmethod
    def restore(self, block: int, token: Any) -> None:
        """Undo the ``remove`` that returned ``token``."""

    def hit(self, block: int) -> None:  # noqa: B027 - optional hook
        """A cache hit reused ``block`` (it may be free or in use); reported once the
        allocation commits, so a hit is never undone."""

    def forget(self, block: int) -> None:  # noqa: B027 - optional hook
        """``block`` lost its content (evicted or its hash dropped): reset its history."""

    def __contains__(self, block: int) -> bool:
        raise NotImplementedError

    def order(self) -> list[int]:
        """Every held block, next victim first (pops them all, then undoes the pops)."""
        popped = [self.pop() for _ in range(len(self))]
        for block, token in reversed(popped):
            self.unpop(block, token)
        return [block for block, _ in popped]


class HitCounts(dict[int, int]):
    """Cache hits per block (absent: none), for policies that weigh reuse."""

    def hit(self, block: int) -> None:
        self[block] = self.get(block, 0) + 1
