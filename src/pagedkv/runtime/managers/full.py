"""Full attention (also MLA and attention sinks): every block lives until the request ends."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from pagedkv.runtime.block_pool import BlockPool
from pagedkv.runtime.managers.base import SingleTypeKVCacheManager, hashes_at_block_size

if TYPE_CHECKING:
    from pagedkv.specs.base import KVCacheSpec


class FullAttentionManager(SingleTypeKVCacheManager):
    """Cache hits are searched left to right and stop at the first miss (the hashes are
    chained, so no later block can hit)."""

    downward_closed_hits: ClassVar[bool] = True

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
        hashes = hashes_at_block_size(block_hashes, hash_block_size, block_size)
        limit = min(max_length // block_size, len(hashes))
        # Identical groups: each group's leading run within the shorter ones so far.
        lists = []
        for gid in kv_cache_group_ids:
            hit = _leading_hits(block_pool.hash_map(gid).get, hashes, limit)
            lists.append(hit)
            limit = len(hit)
        for out in lists:
            del out[limit:]
        num_tokens = limit * block_size
        if alignment_tokens != block_size and num_tokens % alignment_tokens:
            num_tokens -= num_tokens % alignment_tokens
            for out in lists:
                del out[num_tokens // block_size :]
        return lists, num_tokens


def _leading_hits(lookup: Callable[[Any], int | None], hashes: list[Any], limit: int) -> list[int]:
    """Blocks of ``hashes[:limit]`` up to the first miss, looked up in growing chunks at C
    speed (``map`` over ``dict.get``), so a long hit costs a few list operations."""
    hit: list[int] = []
    start, step = 0, 8
    while start < limit:
        end = min(start + step, limit)
        chunk = list(map(lookup, hashes[start:end]))
        if None in chunk:
            hit.extend(chunk[: chunk.index(None)])  # type: ignore[arg-type]
            break
        hit.extend(chunk)  # type: ignore[arg-type]
        start, step = end, step * 2
    return hit
