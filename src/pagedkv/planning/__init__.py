"""Planning: layers into groups (``grouping``, ``pages``), groups into tensors
(``placement``), memory to blocks (``sizing``), the pluggable ``builder``, the
cross-worker ``planner`` and its results (``types``). See docs/ARCHITECTURE.md."""

import importlib
from typing import Any

from pagedkv.planning.builder import (
    DefaultKVCacheConfigBuilder,
    KVCacheConfigBuilder,
    SupportsKVCacheGrouping,
    VLLMRuleKVCacheConfigBuilder,
    get_kv_cache_config_builder,
)
from pagedkv.planning.placement import check_aliasing
from pagedkv.planning.planner import PlannedKVCache, get_kv_cache_configs, plan_kv_cache_configs
from pagedkv.planning.types import (
    DEFAULT_ROLE,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheTensor,
    LayerRegion,
)

__all__ = [
    "Any",
    "DefaultKVCacheConfigBuilder",
    "KVCacheConfigBuilder",
    "SupportsKVCacheGrouping",
    "VLLMRuleKVCacheConfigBuilder",
    "get_kv_cache_config_builder",
    "check_aliasing",
    "PlannedKVCache",
    "get_kv_cache_configs",
    "plan_kv_cache_configs",
    "DEFAULT_ROLE",
    "KVCacheConfig",
    "KVCacheGroupSpec",
    "KVCacheTensor",
    "LayerRegion",
]

# The capacity report lives in pagedkv.capacity, above the core. Its names still resolve
# here for code written against earlier versions: looked up by name on first use, so the
# core never imports the report (the same by-name rule as the registry's start-up hook).
_CAPACITY_NAMES = frozenset(
    {"ConcurrencyPoint", "GroupReport", "GroupingAlternative", "KVCachePlan", "WorkerReport"}
    | {"plan_kv_cache"}
)


def __getattr__(name: str) -> Any:
    if name in _CAPACITY_NAMES:
        return getattr(importlib.import_module("pagedkv.capacity"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
