"""Names from vLLM's ``vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector``.

vLLM's KV connectors (CPU offloading), outside the KV cache layer: importable; using a name raises
``OutsideKVCacheLayerError``."""

from pagedkv.compat.vllm._outside import outside_class

__all__ = ["OffloadingConnector"]

OffloadingConnector = outside_class(
    "OffloadingConnector", "KV connectors (CPU offloading)", __name__
)
