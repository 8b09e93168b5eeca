"""The host pool: a ``BlockPool`` of host blocks that shares its owner's (the GPU pool's)
event queue and transaction journal, so one ``KVCacheManager`` transaction or event
stream covers both tiers."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pagedkv.runtime.block_pool import BlockPool
from pagedkv.runtime.events import KVCacheEvent

__all__ = ["HOST_MEDIUM", "HostBlockPool"]

HOST_MEDIUM = "CPU"  # the medium of the host pool's events


class HostBlockPool(BlockPool):
    """``num_blocks`` host blocks (block 0 the null block) cached like the GPU pool's;
    events go to ``owner``'s queue (medium ``CPU``) and changes to ``owner``'s journal."""

    def __init__(self, num_blocks: int, owner: BlockPool) -> None:
        self._owner = owner
        super().__init__(
            num_blocks, owner.enable_caching, owner.hash_block_size, owner._events is not None
        )
        self.medium = HOST_MEDIUM
        self.num_hash_lookahead_tokens = owner.num_hash_lookahead_tokens

    @property
    def _events(self) -> list[KVCacheEvent] | None:
        return self._owner._events

    @_events.setter
    def _events(self, events: list[KVCacheEvent] | None) -> None:
        return  # the owner's queue: the owner starts and drains it

    @property
    def _journal(self) -> list[tuple[Any, ...]] | None:
        return self._owner._journal

    @_journal.setter
    def _journal(self, journal: list[tuple[Any, ...]] | None) -> None:
        return  # the owner's journal: the owner's transactions begin and end it

    def on_commit(self, change: Callable[..., object], *args: Any) -> None:
        self._owner.on_commit(change, *args)  # the owner's transactions commit it
