from __future__ import annotations

import pagedkv.registry
from pagedkv.registry import KVCacheSpecRegistry
from pagedkv_test_platform_a import EVENTS


class RingManager:
    """Stand-in manager class for the plugin's own kind."""


def register() -> None:
    from pagedkv_test_platform_a.specs import PlatformAFullSpec, PluginRingSpec

    platform_spec_present = PlatformAFullSpec in pagedkv.registry._specs
    EVENTS.append(("plugin", platform_spec_present))
    KVCacheSpecRegistry.register(PluginRingSpec, RingManager)
