"""vLLM's ``vllm.config.cache.CacheConfig`` fields (KV cache options)."""

from __future__ import annotations

from pagedkv.compat.vllm.config._base import ConfigPart
from pagedkv.compat.vllm.config._engine_config import layout_name
from pagedkv.compat.vllm.v1.kv_cache_layout import KVCacheLayout

__all__ = ["CacheConfig"]


class CacheConfig(ConfigPart):
    DEFAULTS = {
        "block_size": 16,
        "gpu_memory_utilization": 0.92,
        "cache_dtype": "auto",
        "num_gpu_blocks_override": None,
        "sliding_window": None,
        "enable_prefix_caching": True,
        "prefix_caching_hash_algo": "sha256",
        "prefix_cache_retention_interval": 0,
        "mamba_block_size": None,
        "mamba_cache_mode": "none",
        "mamba_page_size_padded": None,
        "kv_cache_memory_bytes": None,
        "kv_sharing_fast_prefill": False,
        "num_gpu_blocks": None,
        "num_cpu_blocks": None,
        "kv_cache_layout": None,
        "hash_block_size": None,
        "prefix_match_unit": None,
        "is_attention_free": False,
    }

    def get_resolved_kv_cache_layout(self) -> KVCacheLayout:
        """The layout set on this config (ValueError while none is)."""
        name = layout_name(self.kv_cache_layout)
        if name is None:
            raise ValueError(
                "KV cache layout has not been resolved yet: set CacheConfig.kv_cache_layout "
                "(resolve_kv_cache_layout does so once)"
            )
        if name not in KVCacheLayout.__members__:
            known = ", ".join(KVCacheLayout.__members__)
            raise ValueError(f"CacheConfig.kv_cache_layout must be one of {known}, got {name!r}")
        return KVCacheLayout[name]
