"""The cached part of the LRU free queue: an append-only log of freed cached blocks.

vLLM keeps its free blocks in a doubly linked list. A hash map from block to position
(``OrderedDict``) gives the same order, but each push allocates a node. Here the order is
a plain list that only grows at its tail, read from a head index:

- ``_log[i]`` is live iff ``_pos[block] == i + _base`` (``_base``: the position of
  ``_log[0]``). A hit that takes a block out leaves its entry behind, dead; a pop skips
  dead entries and moves the head past them.
- ``_front`` holds the blocks freed with ``evict_first``, its head at its end; its entry
  ``j`` is live iff ``_pos[block] == -2 - j``. ``_pos[block] == -1``: not in this part.

A push costs a list append and a store per block. Entries behind the head and dead ones
are dropped by ``push`` when they outnumber the live ones. That renumbers the positions,
so it must never run while an undo token is outstanding: the pool frees blocks (the only
caller of ``push``) outside its transactions, never inside an allocation.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import compress
from operator import eq
from typing import Any, NamedTuple

__all__ = [
    "CachedLog",
    "CachedPop",
]

_NOT_HERE = -1
_MIN_COMPACTION = 1024  # entries a compaction drops at least


class CachedPop(NamedTuple):
    """What undoes a ``CachedLog.pop``."""

    front_raw: list[int]  # the front entries it consumed, dead ones included
    front_positions: list[int]  # positions of the live front blocks it took, in order
    head: int  # the log head's position before the pop
    positions: Sequence[int]  # positions of the log blocks it took, in order

    @property
    def num_blocks(self) -> int:
        return len(self.front_positions) + len(self.positions)


class CachedLog:
    """Freed blocks that keep their hash, evicted oldest first (``evict_first`` ones
    before every other, the latest such free first)."""

    def __init__(self, num_blocks: int) -> None:
        self._pos = [_NOT_HERE] * num_blocks
        self._log: list[int] = []
        self._head = 0  # index in _log of the first entry not yet passed
        self._base = 0  # position of _log[0]
        self._front: list[int] = []
        self._num_front = 0  # live front entries
        self.num_blocks = 0  # live entries, front and log

    def __len__(self) -> int:
        return self.num_blocks

    def __contains__(self, block: int) -> bool:
        return self._pos[block] != _NOT_HERE

    def reserve(self, num_ids: int) -> None:
        """Make room for block ids below ``num_ids`` (the pool's are from the start)."""
        missing = num_ids - len(self._pos)
        if missing > 0:
            self._pos += [_NOT_HERE] * missing

    def push(self, blocks: Sequence[int]) -> None:
        """Freed cached blocks at the tail, ``blocks[0]`` evicted first among them."""
        log, pos = self._log, self._pos
        if len(log) - self.num_blocks > max(self.num_blocks, _MIN_COMPACTION):
            self._compact()
            log = self._log
        position = len(log) + self._base
        log.extend(blocks)
        for block in blocks:
            pos[block] = position
            position += 1
        self.num_blocks += len(blocks)

    def push_front(self, blocks: Sequence[int]) -> None:
        """Freed cached blocks before every other, ``blocks[0]`` first."""
        front, pos = self._front, self._pos
        if not self._num_front:
            front.clear()  # dead entries only
        index = len(front)
        for block in reversed(blocks):
            front.append(block)
            pos[block] = -2 - index
            index += 1
        self._num_front += len(blocks)
        self.num_blocks += len(blocks)

    def pop(self, out: list[int], num_blocks: int) -> CachedPop:
        """Append the ``num_blocks`` (at most ``len(self)``) first blocks to ``out``."""
        pos = self._pos
        front_raw: list[int] = []
        front_positions: list[int] = []
        if self._num_front:
            front = self._front
            index = len(front)
            while index and len(front_positions) < num_blocks:
                index -= 1
                block = front[index]
                if pos[block] == -2 - index:
                    out.append(block)
                    front_positions.append(-2 - index)
                    pos[block] = _NOT_HERE
            front_raw = front[index:]
            del front[index:]
            self._num_front -= len(front_positions)
        head = self._head
        start = head + self._base
        need = num_blocks - len(front_positions)
        positions: Sequence[int] = ()
        if need > 0:
            log = self._log
            chunk = log[head : head + need]
            positions = range(start, start + need)
            if list(map(pos.__getitem__, chunk)) == list(positions):  # no dead entry
                for block in chunk:
                    pos[block] = _NOT_HERE
                out += chunk
                self._head = head + need
            else:
                positions = self._pop_past_dead(out, need)
        self.num_blocks -= num_blocks
        return CachedPop(front_raw, front_positions, start, positions)

    def pop_one(self) -> int:
        """``pop`` of one block (``len(self)`` > 0) that will never be undone: no token."""
        if self._num_front:
            out: list[int] = []
            self.pop(out, 1)
            return out[0]
        log, pos, base = self._log, self._pos, self._base
        index = self._head
        block = log[index]
        while pos[block] != index + base:  # dead entries
            index += 1
            block = log[index]
        pos[block] = _NOT_HERE
        self._head = index + 1
        self.num_blocks -= 1
        return block

    def _pop_past_dead(self, out: list[int], num_blocks: int) -> list[int]:
        log, pos, base = self._log, self._pos, self._base
        positions: list[int] = []
        index = self._head
        while len(positions) < num_blocks:
            block = log[index]
            position = index + base
            if pos[block] == position:
                out.append(block)
                positions.append(position)
                pos[block] = _NOT_HERE
            index += 1
        self._head = index
        return positions

    def unpop(self, blocks: Sequence[int], token: CachedPop) -> None:
        """Undo of ``pop``: ``blocks`` are the blocks it appended, in order."""
        pos = self._pos
        num_front = len(token.front_positions)
        for block, position in zip(blocks[num_front:], token.positions):
            pos[block] = position
        self._head = token.head - self._base
        if token.front_raw:
            self._front.extend(token.front_raw)
            for block, position in zip(blocks, token.front_positions):
                pos[block] = position
            self._num_front += num_front
        self.num_blocks += len(blocks)

    def remove(self, block: int) -> int | None:
        """Take ``block`` out; returns its position (the ``reinsert`` token), None if it
        is not in this part."""
        position = self._pos[block]
        if position == _NOT_HERE:
            return None
        self._pos[block] = _NOT_HERE
        if position < 0:
            self._num_front -= 1
        self.num_blocks -= 1
        return position

    def remove_many(self, blocks: Sequence[int]) -> list[Any]:
        """``remove`` of each block, in order (None for those it does not hold)."""
        pos = self._pos
        found: list[int] = list(map(pos.__getitem__, blocks))
        if found and min(found) >= 0:  # all in the log (a hit's common case)
            for block in blocks:
                pos[block] = _NOT_HERE
            self.num_blocks -= len(found)
            return found
        positions: list[Any] = []
        num_removed = 0
        for block in blocks:
            position = pos[block]
            if position == _NOT_HERE:
                positions.append(None)
                continue
            pos[block] = _NOT_HERE
            if position < 0:
                self._num_front -= 1
            positions.append(position)
            num_removed += 1
        self.num_blocks -= num_removed
        return positions

    def reinsert(self, block: int, position: int) -> None:
        """Undo of ``remove``: its entry (still in place) is live again."""
        self._pos[block] = position
        if position < 0:
            self._num_front += 1
        self.num_blocks += 1

    def order(self) -> list[int]:
        """Every block of this part, the next evicted first."""
        pos = self._pos
        out = [block for index, block in enumerate(self._front) if pos[block] == -2 - index]
        out.reverse()
        head = self._head
        out += [
            block
            for position, block in enumerate(self._log[head:], head + self._base)
            if pos[block] == position
        ]
        return out

    def _compact(self) -> None:
        # Outside any transaction (see the module docstring): positions are renumbered.
        pos = self._pos
        segment = self._log[self._head :]
        start = self._head + self._base
        alive = map(eq, map(pos.__getitem__, segment), range(start, start + len(segment)))
        live = list(compress(segment, alive))
        for position, block in enumerate(live):
            pos[block] = position
        self._log = live
        self._head = self._base = 0
