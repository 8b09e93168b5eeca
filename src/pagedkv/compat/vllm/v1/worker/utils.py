"""vLLM's ``vllm.v1.worker.utils``: vLLM's GPU worker, outside the KV cache layer (importable;
using a name raises ``OutsideKVCacheLayerError``)."""

from pagedkv.compat.vllm._outside import outside_function

__all__ = ["allocate_kv_cache"]

allocate_kv_cache = outside_function("allocate_kv_cache", "GPU worker", __name__)
add_kv_sharing_layers_to_kv_cache_groups = outside_function(
    "add_kv_sharing_layers_to_kv_cache_groups", "cross-layer KV sharing", __name__
)
