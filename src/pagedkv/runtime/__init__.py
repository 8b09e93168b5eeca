"""Run time: block hashing, the block pool, per-kind managers, coordinators, KVCacheManager."""

from pagedkv.runtime.block_pool import NULL_BLOCK, BlockPool
from pagedkv.runtime.blocks import KVCacheBlocks
from pagedkv.runtime.builtins import register_builtin_kv_cache_specs
from pagedkv.runtime.coordinators import (
    HybridCoordinator,
    KVCacheCoordinator,
    NoPrefixCacheCoordinator,
    UnitaryCoordinator,
    make_coordinator,
)
from pagedkv.runtime.events import AllBlocksCleared, BlockRemoved, BlockStored, KVCacheEvent
from pagedkv.runtime.hashing import (
    BlockHash,
    BlockHasher,
    LoRA,
    MultiModalFeature,
    builtin,
    get_hash_fn,
    hash_token_blocks,
    sha256,
    sha256_cbor,
    xxhash,
    xxhash128,
    xxhash_cbor,
)
from pagedkv.runtime.kv_cache_manager import KVCacheManager
from pagedkv.runtime.managers import (
    ChunkedLocalAttentionManager,
    CrossAttentionManager,
    FullAttentionManager,
    MambaManager,
    SingleTypeKVCacheManager,
    SlidingWindowManager,
)
from pagedkv.runtime.request import Request
from pagedkv.runtime.stats import PrefixCacheStats

__all__ = [
    "NULL_BLOCK",
    "BlockPool",
    "KVCacheBlocks",
    "register_builtin_kv_cache_specs",
    "HybridCoordinator",
    "KVCacheCoordinator",
    "NoPrefixCacheCoordinator",
    "UnitaryCoordinator",
    "make_coordinator",
    "AllBlocksCleared",
    "BlockRemoved",
    "BlockStored",
    "KVCacheEvent",
    "BlockHash",
    "BlockHasher",
    "LoRA",
    "MultiModalFeature",
    "builtin",
    "get_hash_fn",
    "hash_token_blocks",
    "sha256",
    "sha256_cbor",
    "xxhash",
    "xxhash128",
    "xxhash_cbor",
    "KVCacheManager",
    "ChunkedLocalAttentionManager",
    "CrossAttentionManager",
    "FullAttentionManager",
    "MambaManager",
    "SingleTypeKVCacheManager",
    "SlidingWindowManager",
    "Request",
    "PrefixCacheStats",
]
