"""Names from vLLM's ``vllm.distributed.kv_transfer.kv_connector.v1.base``.

vLLM's KV connectors, outside the KV cache layer: importable; using a name raises
``OutsideKVCacheLayerError``."""

import enum

from pagedkv.compat.vllm._outside import outside_class

__all__ = [
    "KVConnectorRole",
    "KVConnectorBase_V1",
    "KVConnectorMetadata",
    "KVConnectorWorkerMetadata",
    "SupportsHMA",
]

KVConnectorBase_V1 = outside_class("KVConnectorBase_V1", "KV connectors", __name__)
KVConnectorMetadata = outside_class("KVConnectorMetadata", "KV connectors", __name__)
KVConnectorWorkerMetadata = outside_class("KVConnectorWorkerMetadata", "KV connectors", __name__)
SupportsHMA = outside_class("SupportsHMA", "KV connectors", __name__)


class KVConnectorRole(enum.Enum):
    SCHEDULER = 0
    WORKER = 1
