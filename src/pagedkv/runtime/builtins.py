"""Registration of the built-in spec classes with their managers and grouping bases."""

from __future__ import annotations

from pagedkv.registry import KVCacheSpecRegistry
from pagedkv.runtime.managers import (
    ChunkedLocalAttentionManager,
    CrossAttentionManager,
    FullAttentionManager,
    MambaManager,
    SlidingWindowManager,
)
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

# spec class -> (manager class, uniform-type base spec; None = the class itself)
BUILTIN_KV_CACHE_SPECS: dict[type, tuple[type, type | None]] = {
    FullAttentionSpec: (FullAttentionManager, None),
    MLAAttentionSpec: (FullAttentionManager, FullAttentionSpec),
    SinkFullAttentionSpec: (FullAttentionManager, FullAttentionSpec),
    SlidingWindowSpec: (SlidingWindowManager, None),
    SlidingWindowMLASpec: (SlidingWindowManager, None),
    ChunkedLocalAttentionSpec: (ChunkedLocalAttentionManager, None),
    MambaSpec: (MambaManager, None),
    CrossAttentionSpec: (CrossAttentionManager, None),
}


def register_builtin_kv_cache_specs() -> None:
    """Register every built-in spec (idempotent: re-registering the same is a no-op)."""
    for spec_cls, (manager_cls, base) in BUILTIN_KV_CACHE_SPECS.items():
        KVCacheSpecRegistry.register(spec_cls, manager_cls, base)
