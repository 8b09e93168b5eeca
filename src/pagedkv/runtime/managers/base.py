"""The per-group manager interface and the algorithms every kind shares.

A manager owns one KV cache group's block tables: ``req_to_blocks[request_id]`` is a
positional list (entry ``i`` covers tokens ``[i * block_size, (i + 1) * block_size)``;
the null block 0 marks positions the kind no longer needs). Blocks come from the
``BlockPool`` shared by all groups.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from pagedkv.runtime.block_pool import NULL_BLOCK, BlockPool
from pagedkv.specs.base import cdiv

if TYPE_CHECKING:
    from pagedkv.runtime.request import Request
    from pagedkv.specs.base import KVCacheSpec


def hashes_at_block_size(
    block_hashes: list[Any], hash_block_size: int, block_size: int
) -> list[Any]:
    """The chain hashes at ``block_size`` granularity: the last fine hash inside each block."""
    if block_size == hash_block_size:
        return block_hashes
    scale = block_size // hash_block_size
    return block_hashes[scale - 1 :: scale]


class SingleTypeKVCacheManager(ABC):
    """Block tables of one KV cache group, for one kind of layer.

    Every manager takes the same constructor keywords, so a registered custom manager
    can be built by the coordinator without special cases.
    """

    # Whether the kind ever frees blocks of a running request (window, chunk, state).
    skips_tokens: ClassVar[bool] = False
    # Whether a hit of n tokens implies a hit of every shorter prefix (looked up once).
    downward_closed_hits: ClassVar[bool] = False

    def __init__(
        self,
        kv_cache_spec: KVCacheSpec,
        block_pool: BlockPool,
        *,
        kv_cache_group_id: int = 0,
        enable_caching: bool = True,
        hash_block_size: int | None = None,
        alignment_tokens: int | None = None,
        max_model_len: int | None = None,
        in_flight_tokens: int | None = None,
    ) -> None:
        self.kv_cache_spec = kv_cache_spec
        self.block_size = kv_cache_spec.block_size
        self.block_pool = block_pool
        self.kv_cache_group_id = kv_cache_group_id
        self.enable_caching = enable_caching and kv_cache_spec.prefix_cacheable
        self.hash_block_size = hash_block_size or self.block_size
        self.alignment_tokens = alignment_tokens or self.block_size
        self.max_model_len = max_model_len
        self.in_flight_tokens = in_flight_tokens
        self.req_to_blocks: dict[str, list[int]] = {}
        self.num_cached_block: dict[str, int] = {}
        # Block indices, per request, freed with normal priority when skipped.
        self._retained: dict[str, set[int]] = {}

    # ------------------------------------------------------------------ lookup
    @classmethod
    @abstractmethod
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
        """Longest cached prefix of at most ``max_length`` tokens, a multiple of
        ``alignment_tokens``, hit in every group of ``kv_cache_group_ids``.

        Returns one block list per group id (nulls where the kind needs no block)
        and the hit length in tokens. Touches nothing.
        """

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        """Leading tokens whose blocks this kind no longer needs."""
        return 0

    def max_admission_blocks(self) -> int | None:
        """The most blocks a request of this kind holds at once (None: unbounded)."""
        return None

    # -------------------------------------------------------------- allocation
    def get_num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: Sequence[int],
        total_computed_tokens: int,
    ) -> int:
        """Free-queue blocks an allocation up to ``num_tokens`` would consume, counting
        cached hit blocks that must leave the free queue."""
        required = cdiv(num_tokens, self.block_size)
        table = self.req_to_blocks.get(request_id)
        if table is not None:
            return max(required - len(table), 0)
        skipped = self.get_num_skipped_tokens(total_computed_tokens) // self.block_size
        num_new = max(required - max(skipped, len(new_computed_blocks)), 0)
        if not new_computed_blocks:
            return num_new
        # Cached hits with no reference leave the free queue when adopted.
        kept = new_computed_blocks[skipped:] if skipped else new_computed_blocks
        refs = list(map(self.block_pool.ref_cnt.__getitem__, kept))
        return num_new + refs.count(0) - kept.count(NULL_BLOCK)

    def add_local_computed_blocks(
        self, request_id: str, new_computed_blocks: Sequence[int], total_computed_tokens: int
    ) -> None:
        """Start the request's table with its cache hits (touched), nulls where skipped."""
        skipped = self.get_num_skipped_tokens(total_computed_tokens) // self.block_size
        kept = list(new_computed_blocks[skipped:])
        if kept:
            self.block_pool.touch(kept)
        table = [NULL_BLOCK] * skipped + kept if skipped else kept
        self.req_to_blocks[request_id] = table
        self.num_cached_block[request_id] = len(table)

    def allocate_new_blocks(self, request_id: str, num_tokens: int) -> list[int]:
        """Extend the table to cover ``num_tokens`` tokens; returns the new block ids."""
        table = self.req_to_blocks[request_id]
        num_new = cdiv(num_tokens, self.block_size) - len(table)
        if num_new <= 0:
            return []
        new = self.block_pool.get_new_blocks(num_new)
        table.extend(new)
        return new

    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        """Cache the full blocks among the first ``num_tokens`` tokens."""
        request_id = request.request_id
        num_cached = self.num_cached_block[request_id]
        num_full = min(num_tokens, len(request.block_hashes) * self.hash_block_size)
        num_full //= self.block_size
        if num_full > num_cached:
            self.block_pool.cache_full_blocks(
                request,
                self.req_to_blocks[request_id],
                num_cached,
                num_full,
                self.block_size,
                self.kv_cache_group_id,
            )
            self.num_cached_block[request_id] = num_full

    # ----------------------------------------------------------------- freeing
    def free(self, request_id: str, priority: int = 0) -> None:
        """Release the request's blocks, last first (the tail is evicted first).

        Kinds that skip tokens give their blocks the same priorities as when they leave
        the window: early eviction except where a later hit is likely.
        """
        table = self.req_to_blocks.pop(request_id, None)
        self.num_cached_block.pop(request_id, None)
        keep = self._retained.pop(request_id, None)
        if not table:
            return
        if not (self.skips_tokens and self.enable_caching):
            table.reverse()
            self.block_pool.free_blocks(table, priority)
            return
        early: list[int] = []
        kept: list[int] = []
        for i in range(len(table) - 1, -1, -1):
            block = table[i]
            if block:
                if keep is not None and i in keep:
                    kept.append(block)
                else:
                    early.append(block)
        self._free_by_priority(early, kept, priority)

    def remove_skipped_blocks(self, request_id: str, num_computed_tokens: int) -> None:
        """Replace blocks this kind no longer needs by the null block and free them.

        They stay cached but are evicted before other cached blocks, except those a
        later request is likely to hit (see ``set_retained_boundaries``).
        """
        skipped = self.get_num_skipped_tokens(num_computed_tokens)
        table = self.req_to_blocks.get(request_id)
        if skipped <= 0 or not table:
            return
        last = skipped // self.block_size
        if last > len(table):
            last = len(table)
        if last <= 0 or table[last - 1] == NULL_BLOCK:
            return  # the removed region is a prefix: nothing new to remove
        keep = self._retained.get(request_id)
        early: list[int] = []
        kept: list[int] = []
        for i in range(last - 1, -1, -1):
            block = table[i]
            if block == NULL_BLOCK:
                break
            table[i] = NULL_BLOCK
            if keep is not None and i in keep:
                kept.append(block)
            else:
                early.append(block)
        self._free_by_priority(early, kept)

    def _free_by_priority(self, early: list[int], kept: list[int], priority: int = 0) -> None:
        """Free ``early`` ahead of every other cached block, ``kept`` at the LRU tail."""
        pool = self.block_pool
        if early:
            pool.free_blocks(early, priority, evict_first=True)
        if kept:
            pool.free_blocks(kept, priority)

    def hit_block_range(self, num_tokens: int) -> tuple[int, int]:
        """Block indices a cache hit of ``num_tokens`` tokens needs (empty by default)."""
        return 0, 0

    def set_retained_boundaries(self, request_id: str, boundaries: Sequence[int]) -> None:
        """Token positions where later requests are likely to hit (the prompt end, a prefix
        other requests share): the blocks such a hit needs keep normal eviction priority
        when they fall out of this request's window."""
        keep: set[int] = set()
        for boundary in boundaries:
            if boundary > 0:
                keep.update(range(*self.hit_block_range(boundary)))
        if keep:
            self._retained[request_id] = keep

    def rollback(self, request_id: str, saved: tuple[int, int] | None) -> None:
        """Restore the table length and cached count saved before a failed allocation
        (``None``: the request was new). Block references are restored by the pool."""
        if saved is None:
            self.req_to_blocks.pop(request_id, None)
            self.num_cached_block.pop(request_id, None)
            self._retained.pop(request_id, None)
            return
        table = self.req_to_blocks.get(request_id)
        if table is not None:
            del table[saved[0] :]
            self.num_cached_block[request_id] = saved[1]

    def save(self, request_id: str) -> tuple[int, int] | None:
        table = self.req_to_blocks.get(request_id)
        if table is None:
            return None
        return len(table), self.num_cached_block.get(request_id, 0)

    def new_step_starts(self) -> None:  # noqa: B027 - optional hook
        """A new engine step begins (kinds that track per-step state reset it)."""

    def get_blocks(self, request_id: str) -> list[int]:
        return self.req_to_blocks.get(request_id, [])
