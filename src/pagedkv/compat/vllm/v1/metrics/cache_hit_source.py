"""vLLM's ``vllm.v1.metrics.cache_hit_source``: which tier supplied cached tokens."""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum

__all__ = ["CacheHitSource"]


class CacheHitSource(StrEnum):
    """Tiers from the accelerator outwards (the order ``outermost`` ranks them by)."""

    DEVICE = "device"
    HOST = "host"
    P2P = "p2p"
    DISK = "disk"
    EXTERNAL_UNSPECIFIED = "external_unspecified"

    @classmethod
    def outermost(cls, sources: Iterable[CacheHitSource]) -> CacheHitSource:
        order = list(cls)
        return max(sources, key=order.index)
