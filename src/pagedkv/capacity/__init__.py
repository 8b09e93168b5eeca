"""Capacity: what a plan's blocks hold (``plan_kv_cache``, the ``KVCachePlan`` report
the CLI and simulator print). It sits above the core planner and only reads its result."""

from pagedkv.capacity.plan import concurrency_points, full_attention_token_capacity, plan_kv_cache
from pagedkv.capacity.report import (
    ConcurrencyPoint,
    GroupingAlternative,
    GroupReport,
    KVCachePlan,
    WorkerReport,
)

__all__ = [
    "concurrency_points",
    "full_attention_token_capacity",
    "plan_kv_cache",
    "ConcurrencyPoint",
    "GroupingAlternative",
    "GroupReport",
    "KVCachePlan",
    "WorkerReport",
]
