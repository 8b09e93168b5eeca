"""Names from vLLM's ``vllm.v1.attention.backends.triton_attn``.

vLLM's attention backends, outside the KV cache layer: importable; using a name raises
``OutsideKVCacheLayerError``."""

from pagedkv.compat.vllm._outside import outside_class

__all__ = ["TritonAttentionBackend"]

TritonAttentionBackend = outside_class("TritonAttentionBackend", "attention backends", __name__)
