"""vLLM's ``vllm.v1.kv_cache_spec_registry``: spec class -> vLLM-named manager class and
grouping base. Each registration is also made in pagedkv's registry (with the pagedkv
manager the vLLM-named one wraps), which is what grouping and the runtime consult."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from pagedkv.registry import KVCacheSpecRegistry as _CoreRegistry

_BUILTINS_MODULE = "pagedkv.compat.vllm.v1.core.single_type_kv_cache_manager"

__all__ = [
    "_REGISTRY_KVCACHESPEC_LIST",
    "KVCacheSpecMetadata",
    "KVCacheSpecRegistry",
    "register_kv_cache_spec",
]

T = TypeVar("T", bound=type)


@dataclass(frozen=True)
class KVCacheSpecMetadata:
    kvcache_spec_cls: type
    manager_class: type
    uniform_type_base_spec: type


_REGISTRY_KVCACHESPEC_LIST: dict[type, KVCacheSpecMetadata] = {}
_REGISTRY_ROLE_MANAGERS: dict[str, type] = {}


class KVCacheSpecRegistry:
    """vLLM's registry API; lookups walk the spec's MRO as vLLM's do."""

    @classmethod
    def _ensure_registered(cls, vllm_config: Any = None) -> None:
        if _REGISTRY_KVCACHESPEC_LIST:
            return
        # By name: the managers' module imports this one.
        managers = importlib.import_module(_BUILTINS_MODULE)
        managers.register_all_kvcache_specs(vllm_config)

    @classmethod
    def register(
        cls,
        kvcache_spec_cls: type,
        manager_class: type | None = None,
        uniform_type_base_spec: type | None = None,
    ) -> None:
        if manager_class is None:
            raise AssertionError("manager_class is required")
        base = kvcache_spec_cls if uniform_type_base_spec is None else uniform_type_base_spec
        if not issubclass(kvcache_spec_cls, base):
            raise AssertionError(f"{kvcache_spec_cls.__name__} must inherit from {base.__name__}")
        meta = KVCacheSpecMetadata(kvcache_spec_cls, manager_class, base)
        old = _REGISTRY_KVCACHESPEC_LIST.get(kvcache_spec_cls)
        if old is not None and old != meta:
            raise ValueError(
                f"{kvcache_spec_cls.__name__} is already registered with "
                f"{old.manager_class.__name__} and {old.uniform_type_base_spec.__name__}"
            )
        _REGISTRY_KVCACHESPEC_LIST[kvcache_spec_cls] = meta
        core_manager = getattr(manager_class, "impl_class", None)
        if core_manager is not None:
            _CoreRegistry.register(kvcache_spec_cls, core_manager, base)

    @classmethod
    def register_role_manager(cls, role: str, manager_class: type) -> None:
        old = _REGISTRY_ROLE_MANAGERS.get(role)
        if old is not None and old is not manager_class:
            raise ValueError(f"role {role!r} already has manager {old.__name__}")
        _REGISTRY_ROLE_MANAGERS[role] = manager_class

    @classmethod
    def _lookup(cls, kvcache_spec: Any) -> KVCacheSpecMetadata | None:
        cls._ensure_registered()
        for base in type(kvcache_spec).__mro__:
            meta = _REGISTRY_KVCACHESPEC_LIST.get(base)
            if meta is not None:
                return meta
        return None

    @classmethod
    def get_manager_class(cls, kvcache_spec: Any, role: str | None = None) -> type | None:
        cls._ensure_registered()
        if role is not None and (manager := _REGISTRY_ROLE_MANAGERS.get(role)) is not None:
            return manager
        meta = cls._lookup(kvcache_spec)
        return None if meta is None else meta.manager_class

    @classmethod
    def get_uniform_type_base_spec(cls, kvcache_spec: Any) -> type | None:
        meta = cls._lookup(kvcache_spec)
        return None if meta is None else meta.uniform_type_base_spec

    @classmethod
    def check_kv_cache_spec_registry(cls, kv_cache_spec: Mapping[str, Any]) -> None:
        for layer_name, spec in kv_cache_spec.items():
            if cls._lookup(spec) is None:
                raise ValueError(
                    f"Unsupported KV cache spec type for layer {layer_name}: {type(spec).__name__}"
                )


def register_kv_cache_spec(
    manager_class: type | None = None, uniform_type_base_spec: type | None = None
) -> Callable[[T], T]:
    def decorator(kvcache_spec_cls: T) -> T:
        KVCacheSpecRegistry.register(kvcache_spec_cls, manager_class, uniform_type_base_spec)
        return kvcache_spec_cls

    return decorator
