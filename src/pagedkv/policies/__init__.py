"""Eviction policies beyond the runtime's LRU, selectable by name, and the host-memory tier.

Above the core: the runtime never imports this package.
"""

from pagedkv.policies.base import EvictionPolicy
from pagedkv.policies.lfu import LFUPolicy
from pagedkv.policies.lru import LRUPolicy
from pagedkv.policies.priority import PriorityPolicy
from pagedkv.policies.registry import get_policy, policy_names, register_policy
from pagedkv.policies.s3fifo import S3FIFOPolicy

__all__ = [
    "EvictionPolicy",
    "LFUPolicy",
    "LRUPolicy",
    "PriorityPolicy",
    "S3FIFOPolicy",
    "get_policy",
    "policy_names",
    "register_policy",
]
