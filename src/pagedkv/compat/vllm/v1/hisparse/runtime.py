"""Names from vLLM's ``vllm.v1.hisparse.runtime``.

vLLM's HiSparse host tier, outside the KV cache layer: importable; using a name raises
``OutsideKVCacheLayerError``."""

__all__ = []
