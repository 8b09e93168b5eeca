"""vLLM's ``vllm.distributed.kv_transfer.kv_connector.factory``: vLLM's KV connectors, outside the KV cache layer (importable;
using a name raises ``OutsideKVCacheLayerError``)."""

from pagedkv.compat.vllm._outside import outside_class

__all__ = ['KVConnectorFactory']

KVConnectorFactory = outside_class("KVConnectorFactory", "KV connectors", __name__)
