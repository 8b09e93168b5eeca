"""Names from vLLM's ``vllm.distributed.kv_transfer.kv_connector.v1.nixl.scheduler``.

vLLM's NIXL connector, outside the KV cache layer: importable; using a name raises
``OutsideKVCacheLayerError``."""

from pagedkv.compat.vllm._outside import outside_class

__all__ = ["NixlConnectorScheduler"]

NixlConnectorScheduler = outside_class("NixlConnectorScheduler", "NIXL connector", __name__)
