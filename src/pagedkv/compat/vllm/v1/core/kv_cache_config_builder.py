"""vLLM's ``vllm.v1.core.kv_cache_config_builder``: pagedkv's pluggable builder ABC and
vLLM's resolution of the builder the current platform selects for a vLLM config."""

from __future__ import annotations

from typing import Any

from pagedkv.planning.builder import KVCacheConfigBuilder
from pagedkv.platforms import resolve_obj_by_qualname

__all__ = ["KVCacheConfigBuilder", "get_kv_cache_config_builder"]

_VLLM_PREFIX = "vllm."


def _resolve(qualname: str) -> Any:
    """A builder class by name; ``vllm.X`` names resolve to ``pagedkv.compat.vllm.X``."""
    if qualname.startswith(_VLLM_PREFIX):
        return resolve_obj_by_qualname("pagedkv.compat.vllm." + qualname[len(_VLLM_PREFIX) :])
    return resolve_obj_by_qualname(qualname)


def get_kv_cache_config_builder(vllm_config: Any) -> KVCacheConfigBuilder:
    """A fresh instance of the builder ``current_platform`` selects for ``vllm_config``."""
    from pagedkv.compat.vllm import platforms

    builder_cls = _resolve(platforms.current_platform.get_kv_cache_config_builder_cls(vllm_config))
    instance: KVCacheConfigBuilder = builder_cls()
    return instance
