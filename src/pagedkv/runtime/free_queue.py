"""The free queue: the order in which the block pool hands out (and evicts) free blocks.

A rolled-back allocation calls ``unpop`` / ``reinsert`` newest first, so each undo sees the
queue as it was right after the call it undoes. Those are the only undos a queue can
write (frees never happen inside an allocation and hits are reported once it commits),
and they are optional: the pool wraps a queue without them in ``ReplayFreeQueue``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar, NamedTuple

from pagedkv.errors import KVCacheRuntimeError
from pagedkv.runtime.cached_log import CachedLog, CachedPop

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

    def pop_one(self) -> int:
        """``pop(1)`` that will never be undone (outside the pool's transactions): the
        block alone. Override for a cheaper path."""
        return self.pop(1)[0][0]

    def unpop(self, blocks: list[int], token: Any) -> None:
        """Undo of ``pop``: ``blocks`` back at the head, ``blocks[0]`` first. Optional:
        the pool undoes a queue without ``unpop`` and ``reinsert`` by replay
        (``ReplayFreeQueue``)."""
        raise NotImplementedError

    @abstractmethod
    def push_uncached(self, blocks: Sequence[int], priority: int) -> None:
        """Freed blocks without a hash, ``blocks[0]`` handed out first among them."""

    @abstractmethod
    def push_cached(self, blocks: Sequence[int], priority: int, evict_first: bool = False) -> None:
        """Freed blocks that keep their hash, ``blocks[0]`` evicted first among them
        (``evict_first``: before every other cached block)."""

    @abstractmethod
    def remove(self, block: int) -> Any:
        """Take a free block out of the queue (a cache hit; vLLM lets a caller hand in any
        free block, cached or not); returns a position token."""

    def remove_many(self, blocks: Sequence[int]) -> list[Any]:
        """``remove`` of each block in order (one call per touch, never the same block
        twice; override to batch)."""
        return [self.remove(block) for block in blocks]

    def reinsert(self, block: int, token: Any) -> None:
        """Undo of ``remove``: ``block`` back at the position ``token`` records. Optional,
        as ``unpop``."""
        raise NotImplementedError

    @classmethod
    def writes_undo(cls) -> bool:
        """The class undoes its own ``pop`` and ``remove`` (``unpop``, ``reinsert``)."""
        return cls.unpop is not FreeQueue.unpop and cls.reinsert is not FreeQueue.reinsert

    def hit(self, block: int) -> None:  # noqa: B027 - optional hook
        """A cache hit on ``block`` (free or in use); called only if ``wants_hits``, once
        the allocation that took the hit commits (a rolled-back one makes none)."""

    @abstractmethod
    def order(self) -> list[int]:
        """Every free block, head (next handed out) first."""


class LRUFreeQueue(FreeQueue):
    """vLLM's order: freed uncached blocks at the head (LIFO), freed cached ones at the
    tail (LRU). Three parts concatenate to vLLM's one list: ``_stack`` (head at its end),
    the never-used ids ``[_next_fresh, num_blocks)`` and ``_cached`` (a ``CachedLog``).

    A hit is normally a cached block (the LRU part). One on an uncached free block takes
    it out in O(1) too, lazily: a never-used id becomes a hole (``_holes``), a stack entry
    goes stale (``_stale``: block -> stale entries, all below the block's live entry;
    ``_relive``: blocks pushed again while they have stale entries). ``pop`` skips both;
    ``_num_gone`` counts them, so the common path checks one int."""

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self._stack: list[int] = []
        self._next_fresh = 1  # block 0 is the null block
        self._cached = CachedLog(num_blocks)
        self._holes: set[int] = set()  # never-used ids >= _next_fresh taken by a hit
        self._stale: dict[int, int] = {}
        self._relive: set[int] = set()
        self._num_gone = 0  # holes plus stale stack entries
        self._num_free = num_blocks - 1  # kept by every change: read on every step
        # A subclass that overrides ``pop`` sees every pop, ``pop_one``'s too.
        self._pops_itself = type(self).pop is LRUFreeQueue.pop

    def __len__(self) -> int:
        return self._num_free

    def pop(self, num_blocks: int) -> tuple[list[int], Any]:
        self._num_free -= num_blocks
        if self._num_gone:
            return self._pop_around_gone(num_blocks)
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
        return blocks, (fresh, self._cached.pop(blocks, rest) if rest else None)

    def pop_one(self) -> int:
        if self._num_gone or not self._pops_itself:
            return self.pop(1)[0][0]
        self._num_free -= 1
        if self._stack:
            return self._stack.pop()
        block = self._next_fresh
        if block < self.num_blocks:
            self._next_fresh = block + 1
            return block
        return self._cached.pop_one()

    def _pop_around_gone(self, num_blocks: int) -> tuple[list[int], _GonePop]:
        stack, stale, relive = self._stack, self._stale, self._relive
        blocks: list[int] = []
        stale_taken: list[int] = []
        relive_taken: list[int] = []
        i = len(stack)
        while i and len(blocks) < num_blocks:
            i -= 1
            block = stack[i]
            if block not in stale:
                blocks.append(block)
            elif block in relive:  # its topmost entry is the live one
                relive.discard(block)
                relive_taken.append(block)
                blocks.append(block)
            else:
                stale_taken.append(block)
                if stale[block] == 1:
                    del stale[block]
                else:
                    stale[block] -= 1
        raw = stack[i:]
        del stack[i:]
        self._num_gone -= len(stale_taken)
        first_fresh = self._next_fresh
        passed: list[int] = []
        holes = self._holes
        fresh = first_fresh
        while len(blocks) < num_blocks and fresh < self.num_blocks:
            if fresh in holes:
                holes.discard(fresh)
                passed.append(fresh)
            else:
                blocks.append(fresh)
            fresh += 1
        self._next_fresh = fresh
        self._num_gone -= len(passed)
        rest = num_blocks - len(blocks)
        cached = self._cached.pop(blocks, rest) if rest else None
        return blocks, _GonePop(raw, stale_taken, relive_taken, first_fresh, passed, cached)

    def unpop(self, blocks: list[int], token: Any) -> None:
        self._num_free += len(blocks)
        if token is None:
            self._stack.extend(reversed(blocks))
            return
        if isinstance(token, _GonePop):
            self._unpop_around_gone(blocks, token)
            return
        fresh, cached = token
        tail = len(blocks)
        if cached is not None:
            tail -= cached.num_blocks
            self._cached.unpop(blocks[tail:], cached)
        self._next_fresh -= fresh
        self._stack.extend(reversed(blocks[: tail - fresh]))

    def _unpop_around_gone(self, blocks: list[int], token: _GonePop) -> None:
        if token.cached is not None:
            self._cached.unpop(blocks[len(blocks) - token.cached.num_blocks :], token.cached)
        self._next_fresh = token.first_fresh
        self._holes.update(token.passed_holes)
        self._stack.extend(token.raw_stack)
        stale = self._stale
        for block in token.stale_taken:
            stale[block] = stale.get(block, 0) + 1
        self._relive.update(token.relive_taken)
        self._num_gone += len(token.passed_holes) + len(token.stale_taken)

    def push_uncached(self, blocks: Sequence[int], priority: int) -> None:
        self._num_free += len(blocks)
        self._stack.extend(reversed(blocks))
        if self._stale:
            stale = self._stale
            self._relive.update(block for block in blocks if block in stale)

    def push_cached(self, blocks: Sequence[int], priority: int, evict_first: bool = False) -> None:
        self._num_free += len(blocks)
        if evict_first:
            self._cached.push_front(blocks)
        else:
            self._cached.push(blocks)

    def remove(self, block: int) -> Any:
        try:
            token: Any = self._cached.remove(block)  # a cached block: its position there
        except IndexError:
            raise self._outside([block]) from None
        if token is None:
            token = self._remove_uncached(block)
        self._num_free -= 1
        return token

    def remove_many(self, blocks: Sequence[int]) -> list[Any]:
        try:
            tokens: list[Any] = self._cached.remove_many(blocks)
        except IndexError:
            raise self._outside(blocks) from None
        if None in tokens:
            for index, block in enumerate(blocks):
                if tokens[index] is None:
                    tokens[index] = self._remove_uncached(block)
        self._num_free -= len(blocks)
        return tokens

    def _outside(self, blocks: Sequence[int]) -> KVCacheRuntimeError:
        return KVCacheRuntimeError(
            f"free queue: a block of {list(blocks)} is outside the pool "
            f"(0 .. {self.num_blocks - 1})"
        )

    def reserve_ids(self, num_ids: int) -> None:
        """Let ``push_cached`` take block ids below ``num_ids``, beyond the pool's own (a
        queue that holds blocks of its caller's numbering)."""
        self._cached.reserve(num_ids)

    def cached_order(self) -> list[int]:
        """The free blocks that keep their hash, next evicted first (the queue's tail)."""
        return self._cached.order()

    def _remove_uncached(self, block: int) -> tuple[str, bool]:
        """A free block outside the LRU part: a never-used id or a stack entry."""
        if block >= self._next_fresh and block not in self._holes:
            if block >= self.num_blocks:
                raise KVCacheRuntimeError(
                    f"free queue: block {block} is outside the pool (0 .. {self.num_blocks - 1})"
                )
            self._holes.add(block)
            self._num_gone += 1
            return _HOLE, False
        relive = block in self._relive
        self._relive.discard(block)
        stack = self._stack
        if stack and stack[-1] == block:
            stack.pop()
            return _TOP, relive
        self._stale[block] = self._stale.get(block, 0) + 1
        self._num_gone += 1
        return _STALE, relive

    def reinsert(self, block: int, token: Any) -> None:
        self._num_free += 1
        if isinstance(token, tuple):
            self._reinsert_uncached(block, token)
        else:
            self._cached.reinsert(block, token)

    def _reinsert_uncached(self, block: int, token: tuple[str, bool]) -> None:
        where, relive = token
        if where == _HOLE:
            self._holes.discard(block)
            self._num_gone -= 1
            return
        if where == _TOP:
            self._stack.append(block)
        elif self._stale[block] == 1:
            del self._stale[block]
            self._num_gone -= 1
        else:
            self._stale[block] -= 1
            self._num_gone -= 1
        if relive:
            self._relive.add(block)

    def order(self) -> list[int]:
        fresh = range(self._next_fresh, self.num_blocks)
        if not self._num_gone:
            return [*reversed(self._stack), *fresh, *self._cached.order()]
        holes, stale, relive = self._holes, self._stale, self._relive
        live: list[int] = []
        taken: set[int] = set()
        for block in reversed(self._stack):
            if block not in stale:
                live.append(block)
            elif block in relive and block not in taken:
                taken.add(block)
                live.append(block)
        live += [block for block in fresh if block not in holes]
        return [*live, *self._cached.order()]


_HOLE, _TOP, _STALE = "hole", "top", "stale"  # where a removed uncached block was


class _GonePop(NamedTuple):
    """What undoes a pop that met holes or stale entries."""

    raw_stack: list[int]  # the stack entries it consumed, stale ones included
    stale_taken: list[int]
    relive_taken: list[int]
    first_fresh: int
    passed_holes: list[int]
    cached: CachedPop | None  # None: nothing taken from the cached part
