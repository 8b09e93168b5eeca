"""One manager per kind of layer: block tables, cache-hit search, freeing."""

from pagedkv.runtime.managers.base import SingleTypeKVCacheManager
from pagedkv.runtime.managers.chunked_local import ChunkedLocalAttentionManager
from pagedkv.runtime.managers.cross import CrossAttentionManager
from pagedkv.runtime.managers.full import FullAttentionManager
from pagedkv.runtime.managers.hisparse import (
    HiSparseHotManager,
    HiSparseResidentManager,
    HiSparseSourceManager,
)
from pagedkv.runtime.managers.mamba import MambaManager
from pagedkv.runtime.managers.ring import CircularBufferManager
from pagedkv.runtime.managers.rswa import RSWAManager
from pagedkv.runtime.managers.sliding_window import SlidingWindowManager

__all__ = [
    "SingleTypeKVCacheManager",
    "ChunkedLocalAttentionManager",
    "CrossAttentionManager",
    "FullAttentionManager",
    "HiSparseHotManager",
    "HiSparseResidentManager",
    "HiSparseSourceManager",
    "MambaManager",
    "CircularBufferManager",
    "RSWAManager",
    "SlidingWindowManager",
]
