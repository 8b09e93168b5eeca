"""Mamba "align" boundary states offered to a KV connector for offload (opt-in).

An align group's table is not append-only (interior states become nulls, speculative
blocks move, a partial tail's key moves to a copy), so a connector cannot find a cached
state by its position. When a connector asks (``KVCacheManager.offer_boundary_states``),
each Mamba align group records, as it keys a state, the exact block and the token
boundary it holds; the connector drains them once per step. Off by default: then the
groups keep no such list and pay one ``is None`` test per keyed step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pagedkv.runtime.block_pool import BlockPool

__all__ = ["BoundaryStateOffers"]


class BoundaryStateOffers:
    """One Mamba align group's offers: ``(request_id, block, boundary_tokens)`` in the order
    the states were keyed, and each request's own partial tail (the state at the prompt's
    last hash boundary, inside a block the request keeps writing) until it is either
    copied (then the copy is offered) or taken when the request finishes."""

    __slots__ = ("_pending", "_producer_tails")

    def __init__(self) -> None:
        self._pending: list[tuple[str, int, int]] = []
        self._producer_tails: dict[str, tuple[int, int]] = {}

    def offer(self, pool: BlockPool, request_id: str, block: int, num_tokens: int) -> None:
        """Record that ``block`` holds the request's state after ``num_tokens`` tokens
        (undone with the pool's transaction).

        Args:
            pool: the block pool whose open transaction undoes the offer.
            request_id: the request whose state it is.
            block: the block id holding the state.
            num_tokens: the token boundary the state ends at.
        """
        self._pending.append((request_id, block, num_tokens))
        pool.record(self._unoffer)

    def note_producer_tail(
        self, pool: BlockPool, request_id: str, block: int, num_tokens: int
    ) -> None:
        """The request keyed its own partial tail in ``block`` at ``num_tokens``.

        Args:
            pool: the block pool whose open transaction undoes the note.
            request_id: the request that keyed the tail.
            block: the block id holding the tail state.
            num_tokens: the token boundary (inside the block) the state ends at.
        """
        old = self._producer_tails.get(request_id)
        self._producer_tails[request_id] = (block, num_tokens)
        pool.record(self._restore_tail, request_id, old)

    def copy_producer_tail(self, pool: BlockPool, request_id: str, copy: int) -> None:
        """The request's partial tail moved to ``copy`` (copy on write): offer the copy."""
        tail = self._producer_tails.pop(request_id, None)
        if tail is None:
            return
        pool.record(self._restore_tail, request_id, tail)
        self.offer(pool, request_id, copy, tail[1])

    def take_producer_tail(self, request_id: str) -> tuple[int, int] | None:
        """Remove and return the request's uncopied partial tail ``(block, tokens)``."""
        return self._producer_tails.pop(request_id, None)

    def forget(self, request_id: str) -> None:
        """The request's blocks go back to the pool: drop what was not drained yet, since
        another request may be handed those blocks."""
        self._producer_tails.pop(request_id, None)
        if any(entry[0] == request_id for entry in self._pending):
            self._pending = [entry for entry in self._pending if entry[0] != request_id]

    def take(self) -> list[tuple[str, int, int]]:
        """Drain the offers recorded since the last call."""
        pending, self._pending = self._pending, []
        return pending

    def _unoffer(self) -> None:
        self._pending.pop()

    def _restore_tail(self, request_id: str, tail: tuple[int, int] | None) -> None:
        if tail is None:
            self._producer_tails.pop(request_id, None)
        else:
            self._producer_tails[request_id] = tail
