"""Registry mapping KV cache spec classes to their managers and grouping bases.

Imports nothing from specs or runtime: the built-ins register lazily (``pagedkv.bootstrap``).
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from pagedkv.errors import RegistryError

__all__ = [
    "T",
    "KVCacheSpecMetadata",
    "STARTUP_LOCK",
    "KVCacheSpecRegistry",
    "register_kv_cache_spec",
]

_BOOTSTRAP_MODULE = "pagedkv.bootstrap"

T = TypeVar("T", bound=type)


@dataclass(frozen=True)
class KVCacheSpecMetadata:
    """What was registered for one spec class."""

    kvcache_spec_cls: type
    manager_class: type
    # Specs with the same uniform base can share one (uniform-type) KV cache group.
    uniform_type_base_spec: type


# One re-entrant lock for registration and start-up, platforms included: plugins may
# register specs while start-up runs them, so two locks could deadlock.
STARTUP_LOCK = threading.RLock()
_specs: dict[type, KVCacheSpecMetadata] = {}
_roles: dict[str, type] = {}
_state = {"builtins_registered": False, "bootstrapping": False}


def _name(cls: type) -> str:
    return getattr(cls, "__qualname__", repr(cls))


def _check_class(value: object, what: str) -> None:
    if not isinstance(value, type):
        raise RegistryError(f"{what} must be a class, got {value!r}")


class KVCacheSpecRegistry:
    """Global, thread-safe registry of spec classes, their managers and roles."""

    @classmethod
    def ensure_registered(cls, config: Any = None) -> None:
        """Register the built-ins, the platform's specs and the general plugins, once."""
        if _state["builtins_registered"]:
            return
        with STARTUP_LOCK:
            if _state["builtins_registered"] or _state["bootstrapping"]:
                return
            _state["bootstrapping"] = True
            try:
                importlib.import_module(_BOOTSTRAP_MODULE).register_all(config)
                _state["builtins_registered"] = True
            finally:
                _state["bootstrapping"] = False

    _ensure_registered = ensure_registered  # vLLM's name

    @classmethod
    def register(
        cls,
        kvcache_spec_cls: type,
        manager_class: type | None = None,
        uniform_type_base_spec: type | None = None,
    ) -> None:
        """Register a spec class with its manager and grouping base (default: itself)."""
        if not isinstance(kvcache_spec_cls, type):
            raise RegistryError(f"expected a spec class, got {kvcache_spec_cls!r}")
        name = _name(kvcache_spec_cls)
        if manager_class is None:
            raise RegistryError(f"manager_class is required to register {name}")
        _check_class(manager_class, f"manager_class for {name}")
        base = kvcache_spec_cls if uniform_type_base_spec is None else uniform_type_base_spec
        if not isinstance(base, type) or not issubclass(kvcache_spec_cls, base):
            raise RegistryError(
                f"{name} must inherit from its declared uniform_type_base_spec "
                f"{_name(base) if isinstance(base, type) else base!r}"
            )
        meta = KVCacheSpecMetadata(kvcache_spec_cls, manager_class, base)
        with STARTUP_LOCK:
            old = _specs.get(kvcache_spec_cls)
            if old is not None and old != meta:
                raise RegistryError(
                    f"conflicting registration for KV cache spec {name}: already registered "
                    f"with manager {_name(old.manager_class)} and base "
                    f"{_name(old.uniform_type_base_spec)}, now {_name(manager_class)} and "
                    f"{_name(base)}"
                )
            _specs[kvcache_spec_cls] = meta

    @classmethod
    def register_role_manager(cls, role: str, manager_class: type) -> None:
        """Use ``manager_class`` for every group with ``role``, whatever its spec."""
        if not isinstance(role, str) or not role:
            raise RegistryError(f"role must be a non-empty string, got {role!r}")
        _check_class(manager_class, f"manager_class for group role {role!r}")
        with STARTUP_LOCK:
            old = _roles.get(role)
            if old is not None and old is not manager_class:
                raise RegistryError(
                    f"conflicting manager registration for group role {role!r}: "
                    f"{_name(old)} already registered, got {_name(manager_class)}"
                )
            _roles[role] = manager_class

    @classmethod
    def _lookup(cls, spec: Any) -> KVCacheSpecMetadata | None:
        for base in type(spec).__mro__:
            meta = _specs.get(base)
            if meta is not None:
                return meta
        return None

    @classmethod
    def get_manager_class(cls, kvcache_spec: Any, role: str | None = None) -> type | None:
        """Manager for a spec instance: a role manager wins, else the nearest registered class."""
        cls._ensure_registered()
        if role is not None and (manager := _roles.get(role)) is not None:
            return manager
        return getattr(cls._lookup(kvcache_spec), "manager_class", None)

    @classmethod
    def get_uniform_type_base_spec(cls, kvcache_spec: Any) -> type | None:
        """Grouping base of a spec instance (nearest registered class in its MRO)."""
        cls._ensure_registered()
        return getattr(cls._lookup(kvcache_spec), "uniform_type_base_spec", None)

    @classmethod
    def check_kv_cache_spec_registry(cls, kv_cache_spec: Mapping[str, Any]) -> None:
        """Raise RegistryError naming the first layer whose spec type is not registered."""
        cls._ensure_registered()
        for layer_name, spec in kv_cache_spec.items():
            if cls._lookup(spec) is None:
                raise RegistryError(
                    f"unsupported KV cache spec type for layer {layer_name!r}: "
                    f"{_name(type(spec))}; register it with @register_kv_cache_spec"
                )


def register_kv_cache_spec(
    manager_class: type | None = None,
    uniform_type_base_spec: type | None = None,
) -> Callable[[T], T]:
    """Class decorator registering a spec class (see ``KVCacheSpecRegistry.register``)."""

    def decorator(kvcache_spec_cls: T) -> T:
        KVCacheSpecRegistry.register(kvcache_spec_cls, manager_class, uniform_type_base_spec)
        return kvcache_spec_cls

    return decorator
