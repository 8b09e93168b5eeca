"""Ring buffer: one block per request, claimed at its first allocation, held to the end."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from pagedkv.runtime.managers.base import HitQuery, SingleTypeKVCacheManager

__all__ = [
    "CircularBufferManager",
]

if TYPE_CHECKING:
    from pagedkv.runtime.request import Request


class CircularBufferManager(SingleTypeKVCacheManager):
    """The request's table is one block whatever its length: the layer writes its tokens
    round the ring. No hits, no caching, nothing skipped."""

    @classmethod
    def find_longest_cache_hit(cls, query: HitQuery) -> tuple[list[list[int]], int]:
        return [[] for _ in query.group_ids], 0

    def get_num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: Sequence[int],
        total_computed_tokens: int,
        num_tokens_main_model: int,
        apply_admission_cap: bool = False,
        prefill_end: int = 0,
    ) -> int:
        """One block for a request without its ring block yet, else none.

        Args:
            request_id: the request to allocate for.
            num_tokens: unused.
            new_computed_blocks: unused.
            total_computed_tokens: unused.
            num_tokens_main_model: unused.
            apply_admission_cap: unused.
            prefill_end: unused.
        """
        return 0 if self.req_to_blocks.get(request_id) else 1

    def allocate_new_blocks(
        self, request_id: str, num_tokens: int, num_tokens_main_model: int
    ) -> list[int]:
        return self._claim_ring_block(request_id)

    def allocate_external_computed_blocks(
        self, request_id: str, total_computed_tokens: int
    ) -> None:
        """Loaded tokens go round the same one block."""
        self._claim_ring_block(request_id)

    def _claim_ring_block(self, request_id: str) -> list[int]:
        """The request's one block, taken on first use (never queued for zeroing: a request
        reads only the ring slots it wrote)."""
        table = self.req_to_blocks[request_id]
        if table:
            return []
        new = self.block_pool.get_new_blocks(1)
        table.extend(new)
        return new

    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        return
