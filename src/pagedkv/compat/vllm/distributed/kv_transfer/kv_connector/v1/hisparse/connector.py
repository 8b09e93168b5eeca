"""Names from vLLM's ``vllm.distributed.kv_transfer.kv_connector.v1.hisparse.connector``.

vLLM's HiSparse host-tier connector, outside the KV cache layer: importable; using a name raises
``OutsideKVCacheLayerError``."""

from pagedkv.compat.vllm._outside import outside_class

__all__ = ["HiSparseConnector", "HiSparseConnectorScheduler", "HiSparseConnectorWorkerMetadata"]

HiSparseConnector = outside_class("HiSparseConnector", "HiSparse host-tier connector", __name__)
HiSparseConnectorScheduler = outside_class(
    "HiSparseConnectorScheduler", "HiSparse host-tier connector", __name__
)
HiSparseConnectorWorkerMetadata = outside_class(
    "HiSparseConnectorWorkerMetadata", "HiSparse host-tier connector", __name__
)
