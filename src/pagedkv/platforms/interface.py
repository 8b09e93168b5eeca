"""The Platform base class: the hooks pagedkv asks a hardware platform."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pagedkv.config import EngineConfig

DEFAULT_BUILDER_QUALNAME = "pagedkv.planning.builder.DefaultKVCacheConfigBuilder"


class Platform:
    """Hooks a platform can override. All are classmethods; platforms hold no state."""

    name: str = "generic"

    @classmethod
    def register_custom_kv_cache_specs(cls, config: EngineConfig | None) -> None:
        """Register the platform's own spec classes (runs after the built-ins)."""

    @classmethod
    def get_kv_cache_config_builder_cls(cls, config: EngineConfig | None) -> str:
        """Qualified name of the builder: the model's declared one, else the default."""
        if config is not None and config.model.kv_cache_config_builder:
            return config.model.kv_cache_config_builder
        return DEFAULT_BUILDER_QUALNAME

    @classmethod
    def support_hybrid_kv_cache(cls) -> bool:
        """Whether layers of several kinds may keep separate KV cache groups."""
        return True

    @classmethod
    def kv_cache_block_size_multiple(cls, config: EngineConfig | None) -> int:
        """Attention block sizes the kernels accept are multiples of this (used when the
        planner raises the attention block size of an attention + Mamba hybrid)."""
        return 1

    @classmethod
    def default_kv_cache_layout(cls) -> str:
        """Per-block layout of attention pages: 'NHD' (token-major) or 'HND' (head-major)."""
        return "NHD"


class GenericPlatform(Platform):
    name = "generic"
