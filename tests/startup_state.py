"""Test-only control of the global spec registry: snapshots, isolation, a fresh start.

The registry itself keeps only what engines need; tests reach its module state here.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple

import pagedkv.platforms as discovery
import pagedkv.registry as registry_module
from pagedkv.registry import KVCacheSpecMetadata, KVCacheSpecRegistry


class RegistrySnapshot(NamedTuple):
    specs: dict[type, KVCacheSpecMetadata]
    roles: dict[str, type]
    builtins_registered: bool


def snapshot() -> RegistrySnapshot:
    with registry_module.STARTUP_LOCK:
        return RegistrySnapshot(
            dict(registry_module._specs),
            dict(registry_module._roles),
            registry_module._state["builtins_registered"],
        )


def restore(saved: RegistrySnapshot) -> None:
    with registry_module.STARTUP_LOCK:
        registry_module._specs.clear()
        registry_module._specs.update(saved.specs)
        registry_module._roles.clear()
        registry_module._roles.update(saved.roles)
        registry_module._state["builtins_registered"] = saved.builtins_registered


def reset() -> None:
    """Forget every registration, as at import: the next query registers the built-ins."""
    restore(RegistrySnapshot({}, {}, False))


@contextmanager
def isolated(builtins: bool = True) -> Iterator[None]:
    """Run a block against a private copy of the registry, restored afterwards.

    With ``builtins=False`` the registry starts empty and lazy registration is
    suppressed, so only what the block registers exists.
    """
    saved = snapshot()
    try:
        if builtins:
            KVCacheSpecRegistry.ensure_registered()
        else:
            restore(RegistrySnapshot({}, {}, True))
        yield
    finally:
        restore(saved)


class InspectableRegistry(KVCacheSpecRegistry):
    """The registry plus the read-outs and resets tests use (what the fixtures yield)."""

    snapshot = staticmethod(snapshot)
    restore = staticmethod(restore)
    reset = staticmethod(reset)
    isolated = staticmethod(isolated)

    @classmethod
    def get_metadata(cls, spec: Any) -> KVCacheSpecMetadata | None:
        cls._ensure_registered()
        return cls._lookup(spec)

    @classmethod
    def registered_specs(cls) -> dict[type, KVCacheSpecMetadata]:
        cls._ensure_registered()
        return snapshot().specs

    @classmethod
    def registered_roles(cls) -> dict[str, type]:
        cls._ensure_registered()
        return snapshot().roles

    @classmethod
    def builtins_registered(cls) -> bool:
        return registry_module._state["builtins_registered"]


def reset_plugins() -> None:
    """Forget that plugins were loaded (or failed): the next load calls them all again."""
    with registry_module.STARTUP_LOCK:
        discovery._state.update(plugins_done=False, plugin_error=None)
        discovery._loaded_plugins.clear()


def loaded_plugins() -> list[str]:
    """``name=value`` of every general plugin called so far."""
    with registry_module.STARTUP_LOCK:
        return sorted(discovery._loaded_plugins)
