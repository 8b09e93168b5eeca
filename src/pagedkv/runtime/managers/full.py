"""Full attention (also MLA and attention sinks): every block lives until the request ends."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

from pagedkv.runtime.managers.base import HitQuery, SingleTypeKVCacheManager


class FullAttentionManager(SingleTypeKVCacheManager):
    """Cache hits are searched left to right and stop at the first miss (the hashes are
    chained, so no later block can hit)."""

    downward_closed_hits: ClassVar[bool] = True

    @classmethod
    def find_longest_cache_hit(cls, query: HitQuery) -> tuple[list[list[int]], int]:
        block_size = query.spec.block_size
        hashes = query.hashes()
        limit = min(query.max_length // block_size, len(hashes))
        # Identical groups: each group's leading run within the shorter ones so far.
        lists = []
        for gid in query.group_ids:
            hit = _leading_hits(query.block_pool.hash_map(gid).get, hashes, limit)
            lists.append(hit)
            limit = len(hit)
        for out in lists:
            del out[limit:]
        num_tokens = limit * block_size
        alignment = query.alignment_tokens
        if query.drop_eagle_block and num_tokens:
            num_tokens -= min(alignment, block_size)
            for out in lists:
                del out[-(-num_tokens // block_size) :]
        if alignment != block_size and num_tokens % alignment:
            num_tokens -= num_tokens % alignment
            for out in lists:
                del out[num_tokens // block_size :]
        return lists, num_tokens


def _leading_hits(lookup: Callable[[Any], int | None], hashes: list[Any], limit: int) -> list[int]:
    # Looked up in growing chunks at C speed (``map`` over ``dict.get``).
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
