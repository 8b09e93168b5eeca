"""Names from vLLM's ``vllm.v1.hisparse.layout``.

vLLM's HiSparse host tier, outside the KV cache layer: importable; using a name raises
``OutsideKVCacheLayerError``."""

from pagedkv.compat.vllm._outside import outside_function

__all__ = [
    "_build_hisparse_kv_cache_tensors",
    "create_hisparse_layout",
    "get_hisparse_kv_cache_groups",
    "get_hisparse_steady_state_concurrency",
]

_build_hisparse_kv_cache_tensors = outside_function(
    "_build_hisparse_kv_cache_tensors", "HiSparse host tier", __name__
)
create_hisparse_layout = outside_function("create_hisparse_layout", "HiSparse host tier", __name__)
get_hisparse_kv_cache_groups = outside_function(
    "get_hisparse_kv_cache_groups", "HiSparse host tier", __name__
)
get_hisparse_steady_state_concurrency = outside_function(
    "get_hisparse_steady_state_concurrency", "HiSparse host tier", __name__
)
