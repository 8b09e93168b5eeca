"""Platform A's builder: the default one, marked so tests can see it was chosen."""

from __future__ import annotations

from pagedkv.planning.builder import DefaultKVCacheConfigBuilder


class PlatformABuilder(DefaultKVCacheConfigBuilder):
    chosen_by = "test_a"
