"""KVCacheBlocks: the block ids a request got, one list per KV cache group."""

from __future__ import annotations

from typing import NamedTuple

from pagedkv.runtime.block_pool import NULL_BLOCK

__all__ = [
    "KVCacheBlocks",
]


class KVCacheBlocks(NamedTuple):
    """Block ids per group (null blocks are 0). Read-only: the empty one is shared."""

    blocks: tuple[list[int], ...]

    def __add__(self, other: object) -> KVCacheBlocks:
        if not isinstance(other, KVCacheBlocks):
            return NotImplemented
        return KVCacheBlocks(tuple(a + b for a, b in zip(self.blocks, other.blocks, strict=True)))

    def get_block_ids(self) -> tuple[list[int], ...]:
        """A copy of the id lists, one per group."""
        return tuple(list(ids) for ids in self.blocks)

    def get_unhashed_block_ids_all_groups(self, block_hash: list[object]) -> list[int]:
        """Non-null ids without a hash yet (``block_hash``: the pool's per-block hashes)."""
        return [b for ids in self.blocks for b in ids if b != NULL_BLOCK and block_hash[b] is None]
