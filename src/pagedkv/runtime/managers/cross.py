"""Cross attention: encoder keys/values, sized once from the encoder tokens, never cached."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pagedkv.runtime.managers.base import HitQuery, SingleTypeKVCacheManager

__all__ = [
    "CrossAttentionManager",
]

if TYPE_CHECKING:
    from pagedkv.runtime.request import Request


class CrossAttentionManager(SingleTypeKVCacheManager):
    """Blocks for the encoder tokens, allocated at the first allocation, kept to the end."""

    @classmethod
    def find_longest_cache_hit(cls, query: HitQuery) -> tuple[list[list[int]], int]:
        return [[] for _ in query.group_ids], 0

    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        return  # encoder outputs depend on the encoder input, not on a token prefix
