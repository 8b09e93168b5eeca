"""Names from vLLM's ``vllm.v1.attention.backends.mla.sparse_utils``.

vLLM's sparse MLA kernels, outside the KV cache layer: importable; using a name raises
``OutsideKVCacheLayerError``."""

from pagedkv.compat.vllm._outside import outside_function

__all__ = ["flat_kv_row_view"]

flat_kv_row_view = outside_function("flat_kv_row_view", "sparse MLA kernels", __name__)
