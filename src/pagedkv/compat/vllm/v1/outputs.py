"""vLLM's ``vllm.v1.outputs``: vLLM's model runner outputs, outside the KV cache layer (importable;
using a name raises ``OutsideKVCacheLayerError``)."""

from pagedkv.compat.vllm._outside import outside_class

__all__ = ["KVConnectorOutput", "ModelRunnerOutput"]

KVConnectorOutput = outside_class("KVConnectorOutput", "model runner outputs", __name__)
ModelRunnerOutput = outside_class("ModelRunnerOutput", "model runner outputs", __name__)
