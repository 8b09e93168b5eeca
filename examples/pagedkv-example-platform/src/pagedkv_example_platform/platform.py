"""The example platform: what pagedkv asks the hardware."""

from __future__ import annotations

from pagedkv.config import EngineConfig
from pagedkv.platforms import Platform
from pagedkv_example_platform.registration import register_example_specs

BUILDER_QUALNAME = "pagedkv_example_platform.builder.ExampleKVCacheConfigBuilder"

# The example kernels process blocks in tiles of this many tokens.
TILE_TOKENS = 32


class ExamplePlatform(Platform):
    name = "example"

    @classmethod
    def register_custom_kv_cache_specs(cls, config: EngineConfig | None) -> None:
        # Runs at start-up, after the built-ins and before the general plugins.
        register_example_specs()

    @classmethod
    def get_kv_cache_config_builder_cls(cls, config: EngineConfig | None) -> str:
        # A model that declares its own builder still gets it.
        if config is not None and config.model.kv_cache_config_builder:
            return config.model.kv_cache_config_builder
        return BUILDER_QUALNAME

    @classmethod
    def kv_cache_block_size_multiple(cls, config: EngineConfig | None) -> int:
        return TILE_TOKENS

    @classmethod
    def default_kv_cache_layout(cls) -> str:
        return "HND"
