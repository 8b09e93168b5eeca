"""Names from vLLM's ``vllm.distributed.kv_transfer.kv_connector.v1.multi_connector``.

vLLM's KV connectors, outside the KV cache layer: importable; using a name raises
``OutsideKVCacheLayerError``."""

from pagedkv.compat.vllm._outside import outside_class

__all__ = ["MultiConnector"]

MultiConnector = outside_class("MultiConnector", "KV connectors", __name__)
