"""Registration of the built-in spec classes with their managers and grouping bases."""

from __future__ import annotations

from pagedkv import specs as s
from pagedkv.registry import KVCacheSpecRegistry
from pagedkv.runtime import managers as m
from pagedkv.runtime.managers.hisparse import HISPARSE_SOURCE_ROLE

__all__ = [
    "BUILTIN_KV_CACHE_SPECS",
    "BUILTIN_ROLE_MANAGERS",
    "register_builtin_kv_cache_specs",
]

BUILTIN_KV_CACHE_SPECS: dict[type, tuple[type, type | None]] = {
    s.FullAttentionSpec: (m.FullAttentionManager, None),
    s.MLAAttentionSpec: (m.FullAttentionManager, s.FullAttentionSpec),
    s.SinkFullAttentionSpec: (m.FullAttentionManager, s.FullAttentionSpec),
    s.SlidingWindowSpec: (m.SlidingWindowManager, None),
    s.SlidingWindowMLASpec: (m.SlidingWindowManager, None),
    s.ChunkedLocalAttentionSpec: (m.ChunkedLocalAttentionManager, None),
    s.MambaSpec: (m.MambaManager, None),
    s.CrossAttentionSpec: (m.CrossAttentionManager, None),
    s.RSWASpec: (m.RSWAManager, s.FullAttentionSpec),
    s.HiddenStateCacheSpec: (m.FullAttentionManager, s.FullAttentionSpec),
    s.CircularBufferSpec: (m.CircularBufferManager, None),
    s.HiSparseHotSpec: (m.HiSparseHotManager, None),
    s.HiSparseResidentSpec: (m.HiSparseResidentManager, None),
}


# group role -> the manager every group with that role gets, whatever its spec.
BUILTIN_ROLE_MANAGERS: dict[str, type] = {
    HISPARSE_SOURCE_ROLE: m.HiSparseSourceManager,
}


def register_builtin_kv_cache_specs() -> None:
    """Register every built-in spec and role (idempotent: re-registering the same is a
    no-op)."""
    for spec_cls, (manager_cls, base) in BUILTIN_KV_CACHE_SPECS.items():
        KVCacheSpecRegistry.register(spec_cls, manager_cls, base)
    for role, manager_cls in BUILTIN_ROLE_MANAGERS.items():
        KVCacheSpecRegistry.register_role_manager(role, manager_cls)
