"""``ReplayFreeQueue``: a free queue that writes no undo, made undoable by replay.

The block pool wraps any ``FreeQueue`` whose class has no ``unpop`` and ``reinsert`` in
this class (``undoable``): every call that changes the queue is logged, and a rolled-back
``pop`` or ``remove`` rewinds the log and rebuilds the queue from a pickled copy
(``runtime/replay.py``). The queue must be deterministic and keep plain, picklable data.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pagedkv.runtime.free_queue import FreeQueue
from pagedkv.runtime.replay import CallReplay

__all__ = [
    "ReplayFreeQueue",
    "undoable",
]

# The queue calls the wrapper logs, and their number of arguments.
_QUEUE_ARITY = {
    "pop": 1,
    "push_uncached": 2,
    "push_cached": 3,
    "remove": 1,
    "remove_many": 1,
    "hit": 1,
}


def undoable(queue: FreeQueue) -> FreeQueue:
    """``queue`` itself if its class writes undo, else ``queue`` wrapped for replay."""
    return queue if type(queue).writes_undo() else ReplayFreeQueue(queue)


class ReplayFreeQueue(FreeQueue):
    """``inner``, with every change logged; undo tokens are log positions."""

    def __init__(self, inner: FreeQueue) -> None:
        self._replay = CallReplay(inner, _QUEUE_ARITY, max(1024, 2 * (len(inner) + 1)))
        self.wants_hits = inner.wants_hits  # type: ignore[misc]

    @property
    def inner(self) -> FreeQueue:
        return self._replay.target

    def __len__(self) -> int:
        return len(self._replay.target)

    def pop(self, num_blocks: int) -> tuple[list[int], Any]:
        replay = self._replay
        position = replay.position
        return replay.call("pop", num_blocks)[0], position

    def unpop(self, blocks: list[int], token: Any) -> None:
        self._replay.rewind(token)

    def push_uncached(self, blocks: Sequence[int], priority: int) -> None:
        self._replay.call("push_uncached", tuple(blocks), priority)
        self._replay.fold()

    def push_cached(self, blocks: Sequence[int], priority: int, evict_first: bool = False) -> None:
        self._replay.call("push_cached", tuple(blocks), priority, evict_first)
        self._replay.fold()

    def remove(self, block: int) -> Any:
        position = self._replay.position
        self._replay.call("remove", block)
        return position

    def remove_many(self, blocks: Sequence[int]) -> list[Any]:
        position = self._replay.position
        self._replay.call("remove_many", tuple(blocks))
        return [position] * len(blocks)

    def reinsert(self, block: int, token: Any) -> None:
        self._replay.rewind(token)

    def hit(self, block: int) -> None:
        self._replay.call("hit", block)
        self._replay.fold()

    def order(self) -> list[int]:
        return self._replay.target.order()
