"""Eviction policies by name: ``@register_policy("name")`` on an ``EvictionPolicy`` class."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from pagedkv.errors import ConfigError

__all__ = [
    "register_policy",
    "get_policy",
    "policy_names",
]

P = TypeVar("P", bound=type)

_POLICIES: dict[str, type] = {}


def register_policy(name: str) -> Callable[[P], P]:
    """Class decorator: make the policy selectable as ``name``."""

    def decorate(cls: P) -> P:
        if not isinstance(name, str) or not name:
            raise ConfigError(f"an eviction policy name must be a non-empty string, got {name!r}")
        known = _POLICIES.get(name)
        if known is not None and known is not cls:
            raise ConfigError(
                f"eviction policy {name!r} is already registered ({known.__qualname__})"
            )
        _POLICIES[name] = cls
        cls.name = name  # type: ignore[attr-defined]
        return cls

    return decorate


def get_policy(name: str) -> type:
    """The policy class registered as ``name``; ConfigError naming the known ones if none."""
    cls = _POLICIES.get(name)
    if cls is None:  # "lru" too: it is the runtime's LRUFreeQueue, not a policy class
        raise ConfigError(f"unknown eviction policy {name!r}; known: {', '.join(policy_names())}")
    return cls


def policy_names() -> list[str]:
    """Every selectable name: ``lru`` (the runtime's own order) and the registered ones."""
    return sorted({"lru", *_POLICIES})
