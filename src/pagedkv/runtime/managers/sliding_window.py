"""Sliding window attention: only the last ``sliding_window`` tokens are attended, so
blocks entirely before the window are freed and replaced by the null block."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pagedkv.runtime.block_pool import NULL_BLOCK, BlockPool
from pagedkv.runtime.managers.base import SingleTypeKVCacheManager, cdiv, hashes_at_block_size

if TYPE_CHECKING:
    from pagedkv.specs.base import KVCacheSpec


def _window(spec: KVCacheSpec) -> int:
    return int(spec.sliding_window)  # type: ignore[attr-defined]


class SlidingWindowManager(SingleTypeKVCacheManager):
    """A hit needs the ``cdiv(sliding_window - 1, block_size)`` contiguous cached blocks
    ending at the hit (or a shorter run starting at block 0); found right to left."""

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
        need = max(cdiv(_window(kv_cache_spec) - 1, block_size), 1)
        hashes = hashes_at_block_size(block_hashes, hash_block_size, block_size)
        limit = min(max_length // block_size, len(hashes))
        lists = [[NULL_BLOCK] * limit for _ in kv_cache_group_ids]
        aligned = alignment_tokens == block_size
        first_map = block_pool.hash_map(kv_cache_group_ids[0])
        other_maps = [block_pool.hash_map(g) for g in kv_cache_group_ids[1:]]
        run = 0
        for i in range(limit - 1, -1, -1):
            h = hashes[i]
            block = first_map.get(h)
            if block is not None and other_maps:
                others = [m.get(h) for m in other_maps]
                if None in others:
                    block = None
            if block is None:
                run = 0
                continue
            if run == 0 and not aligned and ((i + 1) * block_size) % alignment_tokens:
                continue  # a hit must end on an alignment boundary
            lists[0][i] = block
            if other_maps:
                for out, other in zip(lists[1:], others):
                    out[i] = other  # type: ignore[assignment]
            run += 1
            if run >= need:
                for out in lists:
                    del out[i + run :]
                return lists, (i + run) * block_size
        # No full window found: a run that starts at block 0 still covers a whole prefix.
        num_blocks = run
        if not aligned:
            num_blocks -= num_blocks % (alignment_tokens // block_size)
        for out in lists:
            del out[num_blocks:]
        return lists, num_blocks * block_size

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._retained_tokens: int = self.kv_cache_spec.num_retained_tokens  # type: ignore[attr-defined]

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        skipped = num_computed_tokens - self._retained_tokens
        return skipped if skipped > 0 else 0

    def hit_block_range(self, num_tokens: int) -> tuple[int, int]:
        block_size = self.block_size
        end = (num_tokens - num_tokens % self.alignment_tokens) // block_size
        need = max(cdiv(_window(self.kv_cache_spec) - 1, block_size), 1)
        return max(end - need, 0), end

    def max_admission_blocks(self) -> int | None:
        if self.max_model_len is None:
            return None
        return self.kv_cache_spec.max_admission_blocks_per_request(  # type: ignore[attr-defined]
            self.in_flight_tokens or 0, self.max_model_len
        )
