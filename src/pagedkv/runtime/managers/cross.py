"""Cross attention: encoder keys/values, sized once from the encoder tokens, never cached."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pagedkv.runtime.block_pool import BlockPool
from pagedkv.runtime.managers.base import SingleTypeKVCacheManager

if TYPE_CHECKING:
    from pagedkv.runtime.request import Request
    from pagedkv.specs.base import KVCacheSpec


class CrossAttentionManager(SingleTypeKVCacheManager):
    """The coordinator passes the encoder token count as ``num_tokens``; the blocks are
    allocated at the first allocation and kept until the request ends."""

    @classmethod
    def find_longest_cache_hit(
        cls,
        block_hashes: list[Any],
        max_length: int,
        kv_cache_group_ids: Sequence[int],
        block_pool: BlockPool,
        kv_cache_spec: KVCacheSpec,
        alignment_tokens: int,
        hash_block_size: int,
    ) -> tuple[list[list[int]], int]:
        return [[] for _ in kv_cache_group_ids], 0

    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        return  # encoder outputs depend on the encoder input, not on a token prefix
