"""Chunked local attention: tokens attend within their chunk; earlier chunks are freed."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from pagedkv.runtime.block_pool import NULL_BLOCK
from pagedkv.runtime.managers.base import HitQuery, SingleTypeKVCacheManager

__all__ = [
    "ChunkedLocalAttentionManager",
]

if TYPE_CHECKING:
    from pagedkv.specs.base import KVCacheSpec


def _chunk_size(spec: KVCacheSpec) -> int:
    return int(spec.attention_chunk_size)  # type: ignore[attr-defined]


class ChunkedLocalAttentionManager(SingleTypeKVCacheManager):
    """Blocks of earlier chunks are null; hits are searched from the last chunk's start."""

    skips_tokens = True
    supports_eagle_block_drop = False  # as in vLLM 0.33

    @classmethod
    def find_longest_cache_hit(cls, query: HitQuery) -> tuple[list[list[int]], int]:
        block_size = query.spec.block_size
        chunk = _chunk_size(query.spec)
        hashes = query.hashes()
        start = (query.max_length // chunk) * chunk // block_size
        lists = [[NULL_BLOCK] * start for _ in query.group_ids]
        get = query.block_pool.get_cached_block
        for i in range(start, min(query.max_length // block_size, len(hashes))):
            blocks = get(hashes[i], query.group_ids)
            if blocks is None:
                break
            for out, block in zip(lists, blocks):
                out.append(block)
        num_blocks = len(lists[0])
        if num_blocks == start and (start * block_size) % chunk:
            # Chunk not a multiple of the block size (vLLM never plans one): the block
            # straddling the chunk start is needed, so end at a chunk-and-block boundary.
            step = math.lcm(chunk, block_size)
            num_blocks = (num_blocks * block_size // step) * step // block_size
            for out in lists:
                del out[num_blocks:]
        return lists, num_blocks * block_size

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        chunk = _chunk_size(self.kv_cache_spec)
        return (num_computed_tokens // chunk) * chunk

    def next_skip_tokens(self, num_computed_tokens: int) -> int:
        chunk = _chunk_size(self.kv_cache_spec)
        return (num_computed_tokens // chunk + 1) * chunk

    def hit_block_range(self, num_tokens: int) -> tuple[int, int]:
        chunk = _chunk_size(self.kv_cache_spec)
        return (num_tokens // chunk) * chunk // self.block_size, num_tokens // self.block_size
