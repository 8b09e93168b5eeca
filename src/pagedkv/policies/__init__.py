"""Eviction policies beyond the runtime's LRU, selectable by name, the host-memory tier,
and dense prefix-cache retention.

Above the core: the runtime never imports this package.
"""

from pagedkv.policies.base import EvictionPolicy
from pagedkv.policies.free_queue import PolicyFreeQueue, make_free_queue
from pagedkv.policies.host import HostTier, StorePlan
from pagedkv.policies.lfu import LFUPolicy
from pagedkv.policies.priority import PriorityPolicy
from pagedkv.policies.registry import get_policy, policy_names, register_policy
from pagedkv.policies.retention import DenseRetention
from pagedkv.policies.s3fifo import S3FIFOPolicy
from pagedkv.policies.tiered import (
    TieredHit,
    TieredKVCacheManager,
    Transfers,
    make_kv_cache_manager,
)

__all__ = [
    "DenseRetention",
    "EvictionPolicy",
    "HostTier",
    "PolicyFreeQueue",
    "StorePlan",
    "TieredHit",
    "TieredKVCacheManager",
    "Transfers",
    "make_free_queue",
    "make_kv_cache_manager",
    "LFUPolicy",
    "PriorityPolicy",
    "S3FIFOPolicy",
    "get_policy",
    "policy_names",
    "register_policy",
]
