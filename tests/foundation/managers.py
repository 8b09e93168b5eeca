"""Manager stand-ins for registry tests: the registry only stores classes."""

from __future__ import annotations

from pagedkv.registry import KVCacheSpecRegistry
from pagedkv.specs import (
    ChunkedLocalAttentionSpec,
    CrossAttentionSpec,
    FullAttentionSpec,
    MambaSpec,
    MLAAttentionSpec,
    SinkFullAttentionSpec,
    SlidingWindowMLASpec,
    SlidingWindowSpec,
)


class FullManager:
    pass


class SlidingManager:
    pass


class ChunkedManager:
    pass


class MambaManager:
    pass


class CrossManager:
    pass


class SinkManager(FullManager):
    pass


class RoleManager:
    pass


# Same spec -> (manager, base) table as the built-ins (reference section 2).
TEST_REGISTRATIONS: list[tuple[type, type, type]] = [
    (FullAttentionSpec, FullManager, FullAttentionSpec),
    (SlidingWindowSpec, SlidingManager, SlidingWindowSpec),
    (SlidingWindowMLASpec, SlidingManager, SlidingWindowMLASpec),
    (MambaSpec, MambaManager, MambaSpec),
    (ChunkedLocalAttentionSpec, ChunkedManager, ChunkedLocalAttentionSpec),
    (CrossAttentionSpec, CrossManager, CrossAttentionSpec),
    (MLAAttentionSpec, FullManager, FullAttentionSpec),
    (SinkFullAttentionSpec, SinkManager, FullAttentionSpec),
]


def register_test_managers() -> None:
    for spec_cls, manager, base in TEST_REGISTRATIONS:
        KVCacheSpecRegistry.register(spec_cls, manager, base)
