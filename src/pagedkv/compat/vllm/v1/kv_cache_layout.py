"""vLLM's ``vllm.v1.kv_cache_layout``: the physical layout names of a KV cache group."""

from __future__ import annotations

from enum import Enum

__all__ = ["KVCacheLayout"]


class KVCacheLayout(Enum):
    """Stride permutations of the logical ``[L, B, H, N, C]`` cache shape."""

    LBHNC = (0, 1, 2, 3, 4)
    LBNHC = (0, 1, 3, 2, 4)
    LHBNC = (0, 2, 1, 3, 4)
    BLHNC = (1, 0, 2, 3, 4)
    BLNHC = (1, 0, 3, 2, 4)
    BHLNC = (1, 2, 0, 3, 4)

    @property
    def stride_order(self) -> tuple[int, ...]:
        return self.value

    @property
    def is_block_outermost(self) -> bool:
        """Whether the block dim is physically outermost."""
        return self.stride_order[0] == 1

    @property
    def is_layer_compact(self) -> bool:
        """Whether the layer dim is physically outermost."""
        return self.value[0] == 0

    @property
    def is_block_compact(self) -> bool:
        """Whether each page's bytes form one contiguous run (L and B outermost)."""
        return set(self.value[:2]) == {0, 1}
