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
        try:
            blocks = replay.target.pop(num_blocks)[0]
        except BaseException:
            replay.rewind(position)  # whatever the failed call changed
            raise
        replay.log("pop", num_blocks)
        return blocks, position

    def unpop(self, blocks: list[int], token: Any) -> None:
        self._replay.rewind(token)

    def push_uncached(self, blocks: Sequence[int], priority: int) -> None:
        frozen = tuple(blocks)
        replay = self._replay
        replay.target.push_uncached(frozen, priority)
        replay.log("push_uncached", frozen, priority)
        replay.fold()

    def push_cached(self, blocks: Sequence[int], priority: int, evict_first: bool = False) -> None:
        frozen = tuple(blocks)
        replay = self._replay
        replay.target.push_cached(frozen, priority, evict_first)
        replay.log("push_cached", frozen, priority, evict_first)
        replay.fold()

    def remove(self, block: int) -> Any:
        replay = self._replay
        position = replay.position
        replay.target.remove(block)
        replay.log("remove", block)
        return position

    def remove_many(self, blocks: Sequence[int]) -> list[Any]:
        replay = self._replay
        position = replay.position
        frozen = tuple(blocks)
        try:
            replay.target.remove_many(frozen)
        except BaseException:
            replay.rewind(position)
            raise
        replay.log("remove_many", frozen)
        return [position] * len(frozen)

    def reinsert(self, block: int, token: Any) -> None:
        self._replay.rewind(token)

    def hit(self, block: int) -> None:
        replay = self._replay
        replay.target.hit(block)
        replay.log("hit", block)
        replay.fold()

    def order(self) -> list[int]:
        return self._replay.target.order()
