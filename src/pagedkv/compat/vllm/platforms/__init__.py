"""vLLM's ``vllm.platforms``: pagedkv's current platform under vLLM's names."""

from __future__ import annotations

from typing import Any

from pagedkv.config import EngineConfig
from pagedkv.platforms import Platform as _CorePlatform
from pagedkv.platforms import get_current_platform

__all__ = ["DEFAULT_BUILDER_PATH", "Platform", "current_platform"]

# vLLM's default builder, named as vLLM names it (``pagedkv.compat.vllm`` stands for ``vllm``).
DEFAULT_BUILDER_PATH = "vllm.v1.core.kv_cache_planning.DefaultKVCacheConfigBuilder"


class Platform(_CorePlatform):
    """pagedkv's platform hooks, with vLLM's device queries."""

    device_type = "cpu"

    @classmethod
    def is_xpu(cls) -> bool:
        return False

    @classmethod
    def is_cuda(cls) -> bool:
        return False

    @classmethod
    def is_cpu(cls) -> bool:
        return True

    @classmethod
    def is_cuda_alike(cls) -> bool:
        return False

    @classmethod
    def device_count(cls) -> int:
        return 1

    @classmethod
    def get_kv_cache_config_builder_cls(cls, config: Any) -> str:
        """vLLM's hook over a vLLM config: its default builder (pagedkv's hook for a
        pagedkv ``EngineConfig``)."""
        if config is None or isinstance(config, EngineConfig):
            return super().get_kv_cache_config_builder_cls(config)
        return DEFAULT_BUILDER_PATH


# Hooks whose vLLM form takes vLLM configs: answered by this module's Platform.
_VLLM_HOOKS = frozenset({"get_kv_cache_config_builder_cls"})


class _Current:
    """``current_platform``: forwards to pagedkv's current platform."""

    def __getattr__(self, name: str) -> Any:
        platform = get_current_platform()
        if name not in _VLLM_HOOKS and hasattr(platform, name):
            return getattr(platform, name)
        return getattr(Platform, name)


current_platform: Any = _Current()
