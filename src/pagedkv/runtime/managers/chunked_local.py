"""Chunked local attention: tokens attend within their chunk; earlier chunks are freed."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pagedkv.runtime.block_pool import NULL_BLOCK, BlockPool
from pagedkv.runtime.managers.base import SingleTypeKVCacheManager, hashes_at_block_size

if TYPE_CHECKING:
    from pagedkv.specs.base import KVCacheSpec


def _chunk_size(spec: KVCacheSpec) -> int:
    return int(spec.attention_chunk_size)  # type: ignore[attr-defined]


class ChunkedLocalAttentionManager(SingleTypeKVCacheManager):
    """Blocks of chunks before the current one are null; hits are searched left to right
    from the start of the chunk that holds ``max_length``. A hit made only of nulls ends
    on a chunk boundary (and a block boundary)."""

    skips_tokens = True

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
        block_size = kv_cache_spec.block_size
        chunk = _chunk_size(kv_cache_spec)
        hashes = hashes_at_block_size(block_hashes, hash_block_size, block_size)
        start = (max_length // chunk) * chunk // block_size
        lists = [[NULL_BLOCK] * start for _ in kv_cache_group_ids]
        for i in range(start, min(max_length // block_size, len(hashes))):
            blocks = block_pool.get_cached_block(hashes[i], kv_cache_group_ids)
            if blocks is None:
                break
            for out, block in zip(lists, blocks):
                out.append(block)
        num_blocks = len(lists[0])
        num_blocks -= num_blocks % (max(alignment_tokens // block_size, 1))
        if num_blocks <= start and (num_blocks * block_size) % chunk:
            # Only nulls: valid only if it ends on a chunk boundary (the next token then
            # attends to nothing before it); a block straddling the chunk start is needed.
            step = math.lcm(chunk, block_size, alignment_tokens)
            num_blocks = (num_blocks * block_size // step) * step // block_size
        for out in lists:
            del out[num_blocks:]
        return lists, num_blocks * block_size

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        chunk = _chunk_size(self.kv_cache_spec)
        return (num_computed_tokens // chunk) * chunk

    def hit_block_range(self, num_tokens: int) -> tuple[int, int]:
        aligned = num_tokens - num_tokens % self.alignment_tokens
        chunk = _chunk_size(self.kv_cache_spec)
        return (aligned // chunk) * chunk // self.block_size, aligned // self.block_size

    def max_admission_blocks(self) -> int | None:
        if self.max_model_len is None:
            return None
        return self.kv_cache_spec.max_admission_blocks_per_request(  # type: ignore[attr-defined]
            self.in_flight_tokens or 0, self.max_model_len
        )
