"""Test platform plugin B: the entry point is a function naming the platform class."""

from __future__ import annotations

from pagedkv.platforms import Platform


class TestPlatformB(Platform):
    name = "test_b"

    @classmethod
    def default_kv_cache_layout(cls) -> str:
        return "HND"


def platform_qualname() -> str | None:
    return "pagedkv_test_platform_b.TestPlatformB"
