"""A FIFO queue of block ids with O(1) removal from the middle.

``remove`` returns the block's two neighbours; ``reinsert`` links a block in between two
neighbours (``append`` and ``appendleft`` are its two ends).
"""

from __future__ import annotations

from collections.abc import Iterator

__all__ = [
    "LinkedQueue",
]

_END = -1  # sentinel: head is _next[_END], tail is _prev[_END]


class LinkedQueue:
    __slots__ = ("_next", "_prev")

    def __init__(self) -> None:
        self._next: dict[int, int] = {_END: _END}
        self._prev: dict[int, int] = {_END: _END}

    def __len__(self) -> int:
        return len(self._next) - 1

    def __contains__(self, block: int) -> bool:
        return block != _END and block in self._next

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, LinkedQueue):
            return NotImplemented
        return self._next == other._next and self._prev == other._prev

    __hash__ = None  # type: ignore[assignment]

    def __iter__(self) -> Iterator[int]:
        nxt = self._next
        block = nxt[_END]
        while block != _END:
            yield block
            block = nxt[block]

    def head(self) -> int:
        """The first block (IndexError when empty)."""
        block = self._next[_END]
        if block == _END:
            raise IndexError("empty LinkedQueue")
        return block

    def append(self, block: int) -> None:
        self.reinsert(block, (self._prev[_END], _END))

    def appendleft(self, block: int) -> None:
        self.reinsert(block, (_END, self._next[_END]))

    def remove(self, block: int) -> tuple[int, int]:
        """Unlink ``block``; returns ``(previous, next)`` for ``reinsert``."""
        prev = self._prev.pop(block)
        nxt = self._next.pop(block)
        self._next[prev] = nxt
        self._prev[nxt] = prev
        return prev, nxt

    def reinsert(self, block: int, neighbours: tuple[int, int]) -> None:
        prev, nxt = neighbours
        self._next[prev] = block
        self._prev[nxt] = block
        self._prev[block] = prev
        self._next[block] = nxt

    def popleft(self) -> int:
        block = self.head()
        self.remove(block)
        return block

    def pop(self) -> int:
        """Remove the last block."""
        block = self._prev[_END]
        if block == _END:
            raise IndexError("empty LinkedQueue")
        self.remove(block)
        return block
