"""Mamba / linear-attention state.

Mode "none" (no prefix caching): the request's state lives in its last block; blocks
behind it are freed (with ``block_size == max_model_len`` that is a single block).
Mode "align": block ``i`` holds the state after token ``(i + 1) * block_size``: each
full block is a checkpoint that is cached like an attention block, and a hit is the
single latest cached checkpoint, preceded by nulls. A checkpoint cached during the
current step is written by that step's forward pass: a new request whose hit ends on one
is refused (``allocate_slots`` returns None) until it is written, and gets it then.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pagedkv.runtime.block_pool import NULL_BLOCK, BlockPool
from pagedkv.runtime.managers.base import SingleTypeKVCacheManager, hashes_at_block_size

if TYPE_CHECKING:
    from pagedkv.runtime.request import Request
    from pagedkv.specs.base import KVCacheSpec


class MambaManager(SingleTypeKVCacheManager):
    """State blocks: only the block holding the latest computed state is kept."""

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
        hashes = hashes_at_block_size(block_hashes, hash_block_size, block_size)
        for i in range(min(max_length // block_size, len(hashes)) - 1, -1, -1):
            if ((i + 1) * block_size) % alignment_tokens:
                continue
            blocks = block_pool.get_cached_block(hashes[i], kv_cache_group_ids)
            if blocks is None:
                continue
            return [[NULL_BLOCK] * i + [b] for b in blocks], (i + 1) * block_size
        return [[] for _ in kv_cache_group_ids], 0

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        return max(num_computed_tokens - 1, 0)

    def max_admission_blocks(self) -> int | None:
        """The live state block plus the blocks of one step's tokens."""
        if self.max_model_len is None or self.in_flight_tokens is None:
            return None
        tokens = min(self.in_flight_tokens, self.max_model_len)
        return -(-tokens // self.block_size) + 1

    def hit_block_range(self, num_tokens: int) -> tuple[int, int]:
        end = (num_tokens - num_tokens % self.alignment_tokens) // self.block_size
        return max(end - 1, 0), end

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._cached_this_step: set[Any] = set()  # hashes cached in the current step

    def get_num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: Sequence[int],
        total_computed_tokens: int,
    ) -> int:
        if (
            new_computed_blocks
            and self._cached_this_step
            and self.block_pool.block_hash[new_computed_blocks[-1]] in self._cached_this_step
        ):
            return self.block_pool.num_blocks + 1  # the state is written this step
        return super().get_num_blocks_to_allocate(
            request_id, num_tokens, new_computed_blocks, total_computed_tokens
        )

    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        table = self.req_to_blocks[request.request_id]
        first = self.num_cached_block[request.request_id]
        super().cache_blocks(request, num_tokens)
        last = self.num_cached_block[request.request_id]
        hashes = self.block_pool.block_hash
        for block in table[first:last]:
            if block and hashes[block] is not None:
                self._cached_this_step.add(hashes[block])

    def new_step_starts(self) -> None:
        self._cached_this_step.clear()
