"""Exception types. Everything a user can cause raises one of these."""

from __future__ import annotations

__all__ = [
    "PagedKVError",
    "ConfigError",
    "UnknownDtypeError",
    "KVCacheSpecError",
    "RegistryError",
    "PlatformError",
    "PlanningError",
    "InsufficientMemoryError",
    "ModelConfigError",
    "TraceFormatError",
    "NoFreeBlocksError",
    "KVCacheRuntimeError",
]


class PagedKVError(Exception):
    """Base class of every error pagedkv raises on purpose."""


class ConfigError(PagedKVError, ValueError):
    """An EngineConfig field or option is invalid."""


class UnknownDtypeError(ConfigError):
    """A KV cache dtype name is not known."""


class KVCacheSpecError(PagedKVError, ValueError):
    """A spec is invalid, or specs that must agree do not."""


class RegistryError(PagedKVError, ValueError):
    """A registration is invalid or conflicts with an earlier one."""


class PlatformError(PagedKVError, RuntimeError):
    """A platform or plugin cannot be resolved or loaded."""


class PlanningError(PagedKVError, ValueError):
    """The KV cache cannot be planned as asked."""


class InsufficientMemoryError(PlanningError):
    """Not enough memory for one request of max_model_len."""


class ModelConfigError(PagedKVError, ValueError):
    """A model config cannot be turned into specs."""


class TraceFormatError(PagedKVError, ValueError):
    """A request trace is malformed."""


class NoFreeBlocksError(PagedKVError, ValueError):
    """The block pool has fewer free blocks than were asked for."""


class KVCacheRuntimeError(PagedKVError, ValueError):
    """A runtime call (block pool, KV cache manager, request) got arguments it cannot accept."""
