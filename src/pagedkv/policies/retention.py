"""Dense retention (``CacheConfig.prefix_cache_retention="dense"``), pagedkv's opt-in beside
vLLM's sparse one: a kind that frees blocks of running requests (window, chunk, Mamba)
caches every full block, and blocks it frees go to the front of the cached part of the
free queue (still hits until needed, evicted before every other cached block), except
those a hit at the prompt end, the shared-prefix junction or the adopted hit needs,
which keep LRU order. The runtime imports this class by name (config.PREFIX_CACHE_RETENTIONS).
"""

from __future__ import annotations

from collections.abc import Sequence

from pagedkv.runtime.managers.base import Retention, SingleTypeKVCacheManager
from pagedkv.runtime.request import Request

__all__ = [
    "DenseRetention",
]


class DenseRetention(Retention):
    """Per manager; kinds that never free a running request's blocks (full and cross
    attention) behave as under vLLM's retention."""

    def __init__(self, manager: SingleTypeKVCacheManager) -> None:
        super().__init__(manager)
        self.dense = manager.skips_tokens
        self.retained: dict[str, set[int]] = {}  # positions freed in LRU order

    def blocks_to_cache(
        self, manager: SingleTypeKVCacheManager, request: Request, start: int, end: int
    ) -> set[int] | None:
        """Dense kinds cache every full block, remembering the positions a hit needs.

        Args:
            manager: the single-type manager of the request's group.
            request: the request being allocated.
            start: first token position of the range.
            end: one past the last token position of the range.

        Returns:
            None (cache every block) under dense retention; vLLM's positions otherwise.
        """
        if not self.dense:
            return super().blocks_to_cache(manager, request, start, end)
        boundaries = manager.boundary_blocks(request, 0, end, request.num_cached_tokens)
        # Kept once the allocation commits: a failed one leaves the old positions.
        self.block_pool.on_commit(self.retained.__setitem__, request.request_id, boundaries)
        return None

    def release(
        self, request_id: str, indices: Sequence[int], blocks: list[int], priority: int = 0
    ) -> None:
        """Dense kinds free the blocks a hit needs in LRU order, the others to go first.

        Args:
            request_id: the request whose blocks are freed.
            indices: the blocks' positions in the request's table.
            blocks: the block ids (0 for null blocks, skipped).
            priority: the request's priority, passed to the pool.
        """
        if not self.dense:
            super().release(request_id, indices, blocks, priority)
            return
        retained = self.retained.get(request_id)
        early: list[int] = []
        kept: list[int] = []
        for i, block in zip(indices, blocks):
            if block:
                (kept if retained is not None and i in retained else early).append(block)
        if early:
            self.block_pool.free_blocks(early, priority, evict_first=True)
        if kept:
            self.block_pool.free_blocks(kept, priority)

    def forget(self, request_id: str) -> None:
        self.retained.pop(request_id, None)
