"""vLLM's ``vllm.v1.engine.core``: vLLM's engine core, outside the KV cache layer (importable;
using a name raises ``OutsideKVCacheLayerError``)."""

from pagedkv.compat.vllm._outside import outside_class

__all__ = ["EngineCore"]

EngineCore = outside_class("EngineCore", "engine core", __name__)
