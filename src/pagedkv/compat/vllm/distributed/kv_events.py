"""vLLM's ``vllm.distributed.kv_events``: pagedkv's event structs (vLLM's wire format)."""

from pagedkv.runtime.events import AllBlocksCleared, BlockRemoved, BlockStored, KVCacheEvent

__all__ = [
    "MEDIUM_CPU",
    "MEDIUM_GPU",
    "AllBlocksCleared",
    "BlockRemoved",
    "BlockStored",
    "KVCacheEvent",
]

MEDIUM_GPU = "GPU"
MEDIUM_CPU = "CPU"
