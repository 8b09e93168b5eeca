"""vLLM's ``vllm.v1.core.kv_cache_metrics``: pagedkv's block residency metrics."""

from pagedkv.runtime.residency import BlockMetricsState, KVCacheMetricsCollector

__all__ = ["BlockMetricsState", "KVCacheMetricsCollector"]
