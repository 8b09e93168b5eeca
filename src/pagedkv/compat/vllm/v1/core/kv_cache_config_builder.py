"""vLLM's ``vllm.v1.core.kv_cache_config_builder``: pagedkv's pluggable builder ABC."""

from pagedkv.planning.builder import KVCacheConfigBuilder, get_kv_cache_config_builder

__all__ = ["KVCacheConfigBuilder", "get_kv_cache_config_builder"]
