"""EvictionPolicy: which free cached block of a pool is evicted next.

A policy orders only the *cached* free blocks (the pool keeps uncached free blocks and
never-used ones itself). It writes no undo code: when an allocation that popped or
revived blocks fails, the policy free queue rebuilds the policy from a pickled copy and
the calls made since (``pagedkv.runtime.replay``). So a policy keeps plain, picklable data and is
deterministic: the same calls, in the same order, leave it in the same state. A policy
that is a sort key subclasses ``HeapPolicy`` and defines ``level``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar

from pagedkv.runtime.replay import freeze, thaw

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
    def pop(self) -> int:
        """Remove and return the victim; IndexError if empty."""

    def pop_blocks(self, count: int) -> list[int]:
        """``count`` pops: the victims in order."""
        return [self.pop() for _ in range(count)]

    @abstractmethod
    def remove(self, block: int) -> None:
        """``block`` was revived (a cache hit took a reference)."""

    def hit(self, block: int) -> None:  # noqa: B027 - optional hook
        """A cache hit reused ``block`` (it may be free or in use); reported once the
        allocation commits."""

    def forget(self, block: int) -> None:  # noqa: B027 - optional hook
        """``block`` lost its content (evicted or its hash dropped): reset its history."""

    def __contains__(self, block: int) -> bool:
        raise NotImplementedError

    def order(self) -> list[int]:
        """Every held block, next victim first (pops them all from a copy)."""
        copy = thaw(type(self), freeze(self))
        return copy.pop_blocks(len(copy))


class HitCounts(dict[int, int]):
    """Cache hits per block (absent: none), for policies that weigh reuse."""

    def hit(self, block: int) -> None:
        self[block] = self.get(block, 0) + 1
