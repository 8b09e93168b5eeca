"""Full attention (also MLA and attention sinks): every block lives until the request ends."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

from pagedkv.runtime.managers.base import HitQuery, SingleTypeKVCacheManager

__all__ = [
    "FullAttentionManager",
]

if TYPE_CHECKING:
    from pagedkv.runtime.hashing import BlockHash
    from pagedkv.runtime.request import Request


class FullAttentionManager(SingleTypeKVCacheManager):
    """Cache hits are searched left to right and stop at the first miss (the hashes are
    chained, so no later block can hit)."""

    downward_closed_hits: ClassVar[bool] = True
    supports_fine_grained_hits: ClassVar[bool] = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Hashes finer than the block: the prompt's last hash boundary inside a block is
        # keyed too (vLLM does so whenever the sizes differ, partial hits on or not).
        self.keys_partial_tails = self.hash_block_size != self.block_size
        self.use_eagle = False  # EAGLE: a lookup reads the whole prompt before its drop

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
        if alignment < block_size and block_size % alignment == 0:
            num_tokens = _extend_into_block(query, lists, num_tokens)
        if query.drop_eagle_block and num_tokens:
            num_tokens -= min(alignment, block_size)
            for out in lists:
                del out[-(-num_tokens // block_size) :]  # cdiv inline: see _grow_table
        if alignment != block_size and num_tokens % alignment:
            num_tokens -= num_tokens % alignment
            for out in lists:
                del out[num_tokens // block_size :]
        return lists, num_tokens

    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        super().cache_blocks(request, num_tokens)
        if self.keys_partial_tails:
            self._cache_partial_tail(request, num_tokens)

    def takes_plain_steps(self) -> bool:
        return (
            type(self).cache_blocks is FullAttentionManager.cache_blocks
            and not self.keys_partial_tails
            and self._plain_parts()
        )

    def _cache_partial_tail(self, request: Request, num_tokens: int) -> None:
        """Key the block holding the prompt's last hash boundary at that boundary, so a
        request sharing the prompt hits inside the block."""
        tail = self._partial_tail(request, num_tokens)
        if tail is not None:
            block, boundary = tail
            group_id = self.kv_cache_group_id
            self.block_pool.cache_partial_block(request, block, boundary, group_id, self.block_size)

    def tail_key_pending(self, request: Request, num_tokens: int) -> bool:
        """Whether ``cache_blocks(request, num_tokens)`` would add the partial tail's key."""
        tail = self._partial_tail(request, num_tokens)
        if tail is None:
            return False
        block, boundary = tail
        h = request.block_hashes[boundary // self.hash_block_size - 1]
        return not self.block_pool.has_key(block, h, self.kv_cache_group_id)

    def _partial_tail(self, request: Request, num_tokens: int) -> tuple[int, int] | None:
        # (block, boundary) of the prompt's last hash boundary inside a block, if computed.
        unit = self.hash_block_size
        limit = request.num_prompt_tokens - (0 if self.use_eagle else 1)
        boundary = min(limit // unit, len(request.block_hashes)) * unit
        if boundary == 0 or boundary > num_tokens or boundary % self.block_size == 0:
            return None
        table = self.req_to_blocks[request.request_id]
        index = boundary // self.block_size
        return (table[index], boundary) if index < len(table) else None


_BISECTED_CHUNK = 64  # hashes in a chunk worth one probe of its last hash first


def _extend_into_block(query: HitQuery, lists: list[list[int]], num_tokens: int) -> int:
    # Partial hits: probe the hash boundaries inside the block after the full-block hit,
    # longest first; a hit there adds that block.
    unit = query.alignment_tokens
    per_block = query.spec.block_size // unit
    first = num_tokens // unit
    last = min(first + per_block - 1, query.max_length // unit, len(query.block_hashes))
    get = query.block_pool.get_cached_block
    for i in range(last - 1, first - 1, -1):
        blocks = get(query.block_hashes[i], query.group_ids)
        if blocks is not None:
            for out, block in zip(lists, blocks):
                out.append(block)
            return (i + 1) * unit
    return num_tokens


def _leading_hits(
    lookup: Callable[[BlockHash], int | None], hashes: list[BlockHash], limit: int
) -> list[int]:
    # Looked up in growing chunks at C speed (``map`` over ``dict.get``). A long chunk
    # whose last hash misses holds the first miss: it is cut at the miss a bisection finds
    # (one with a hit before it: the first miss if the hits form one run), and mapping the
    # rest still shows any earlier miss.
    hit: list[int] = []
    start, step = 0, 8
    while start < limit:
        end = min(start + step, limit)
        missed = end - start >= _BISECTED_CHUNK and lookup(hashes[end - 1]) is None
        if missed:
            end = _bisect_miss(lookup, hashes, start, end - 1)
        chunk = list(map(lookup, hashes[start:end]))
        if None in chunk:
            hit.extend(chunk[: chunk.index(None)])  # type: ignore[arg-type]
            break
        hit.extend(chunk)  # type: ignore[arg-type]
        if missed:
            break
        start, step = end, step * 2
    return hit


def _bisect_miss(
    lookup: Callable[[BlockHash], int | None], hashes: list[BlockHash], low: int, miss: int
) -> int:
    # A missing index in [low, miss] whose predecessor (if at least low) hits, given that
    # ``miss`` misses.
    while low < miss:
        middle = (low + miss) // 2
        if lookup(hashes[middle]) is None:
            miss = middle
        else:
            low = middle + 1
    return miss
