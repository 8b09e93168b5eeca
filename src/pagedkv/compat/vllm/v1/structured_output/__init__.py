"""Names from vLLM's ``vllm.v1.structured_output``.

vLLM's structured output, outside the KV cache layer: importable; using a name raises
``OutsideKVCacheLayerError``."""

from pagedkv.compat.vllm._outside import outside_class

__all__ = ["StructuredOutputManager"]

StructuredOutputManager = outside_class("StructuredOutputManager", "structured output", __name__)
