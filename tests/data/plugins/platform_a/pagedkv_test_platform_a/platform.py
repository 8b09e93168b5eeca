from __future__ import annotations

from typing import Any

import pagedkv.registry
from pagedkv.platforms import Platform
from pagedkv.registry import KVCacheSpecRegistry
from pagedkv.specs import FullAttentionSpec
from pagedkv_test_platform_a import EVENTS


class TestPlatformA(Platform):
    name = "test_a"

    @classmethod
    def register_custom_kv_cache_specs(cls, config: Any) -> None:
        from pagedkv_test_platform_a.specs import PlatformAFullSpec

        builtins_present = FullAttentionSpec in pagedkv.registry._specs
        EVENTS.append(("platform", builtins_present))
        manager = KVCacheSpecRegistry.get_manager_class(
            FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=8)
        )
        assert manager is not None
        KVCacheSpecRegistry.register(PlatformAFullSpec, manager, FullAttentionSpec)

    @classmethod
    def get_kv_cache_config_builder_cls(cls, config: Any) -> str:
        return "pagedkv_test_platform_a.builder.PlatformABuilder"

    @classmethod
    def support_hybrid_kv_cache(cls) -> bool:
        return False
