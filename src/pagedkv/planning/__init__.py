"""Planning: grouping layers, placing tensors, memory to block counts."""

from pagedkv.planning.report import (
    ConcurrencyPoint,
    GroupingAlternative,
    GroupReport,
    KVCachePlan,
    WorkerReport,
)
from pagedkv.planning.types import (
    DEFAULT_ROLE,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheTensor,
    LayerRegion,
)

__all__ = [
    "DEFAULT_ROLE",
    "ConcurrencyPoint",
    "GroupReport",
    "GroupingAlternative",
    "KVCacheConfig",
    "KVCacheGroupSpec",
    "KVCachePlan",
    "KVCacheTensor",
    "LayerRegion",
    "WorkerReport",
]
