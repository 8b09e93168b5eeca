"""Names from vLLM's ``vllm.distributed.kv_transfer.kv_connector.v1.moriio.moriio_engine``.

vLLM's MoRIIO connector, outside the KV cache layer: importable; using a name raises
``OutsideKVCacheLayerError``."""

from pagedkv.compat.vllm._outside import outside_class

__all__ = ["MoRIIOWriter"]

MoRIIOWriter = outside_class("MoRIIOWriter", "MoRIIO connector", __name__)
