"""vLLM's ``vllm.config.cache.CacheConfig`` fields (KV cache options)."""

from __future__ import annotations

from pagedkv.compat.vllm.config._base import ConfigPart

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
