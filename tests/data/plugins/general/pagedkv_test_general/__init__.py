"""A general plugin: registers its own spec kind; ``CALLS`` counts how often it ran."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from pagedkv.registry import KVCacheSpecRegistry
from pagedkv.specs import SlidingWindowSpec

CALLS: list[int] = []


@dataclass(frozen=True, kw_only=True)
class GeneralPluginWindowSpec(SlidingWindowSpec):
    """A sliding window kind that groups with sliding windows."""

    kind: ClassVar[str] = "general_plugin_window"


def register() -> None:
    CALLS.append(1)
    window = SlidingWindowSpec(block_size=16, num_kv_heads=1, head_size=8, sliding_window=16)
    manager = KVCacheSpecRegistry.get_manager_class(window)
    assert manager is not None
    KVCacheSpecRegistry.register(GeneralPluginWindowSpec, manager, SlidingWindowSpec)
