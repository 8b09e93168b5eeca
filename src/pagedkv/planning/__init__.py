"""Planning: grouping layers, placing tensors, memory to block counts."""

from pagedkv.planning.types import (
    DEFAULT_ROLE,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheTensor,
    LayerRegion,
)

__all__ = ["DEFAULT_ROLE", "KVCacheConfig", "KVCacheGroupSpec", "KVCacheTensor", "LayerRegion"]
