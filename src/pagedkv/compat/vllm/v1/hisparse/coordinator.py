"""Names from vLLM's ``vllm.v1.hisparse.coordinator``.

vLLM's HiSparse host tier, outside the KV cache layer: importable; using a name raises
``OutsideKVCacheLayerError``."""

from pagedkv.compat.vllm._outside import outside_function

__all__ = ["get_hisparse_coordinator"]

get_hisparse_coordinator = outside_function(
    "get_hisparse_coordinator", "HiSparse host tier", __name__
)
