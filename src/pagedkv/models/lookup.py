"""Finding a config's adapter; the built-in adapters register themselves on first use.

Kept apart from ``registry`` (which the adapters import to register) so that neither
module imports the other back.
"""

from __future__ import annotations

from typing import Any

from pagedkv.errors import ModelConfigError
from pagedkv.models.registry import ModelAdapter, _adapters, _lock
from pagedkv.models.source import ModelSource

_builtins_loaded = False


def _load_builtins() -> None:
    global _builtins_loaded
    if _builtins_loaded:
        return
    with _lock:
        if not _builtins_loaded:
            import pagedkv.models.adapters  # noqa: F401  (registers on import)

            _builtins_loaded = True


def registered_adapter_names() -> list[str]:
    _load_builtins()
    return sorted(_adapters)


def find_adapter(source: ModelSource) -> ModelAdapter:
    """The adapter for the config's first architecture, else its model_type."""
    _load_builtins()
    keys: list[Any] = [source.architecture, source.model_type]
    keys.append(source.text_config.get("model_type"))
    for key in keys:
        if isinstance(key, str) and key in _adapters:
            return _adapters[key]()
    label = source.architecture or source.model_type or "none given"
    raise ModelConfigError(
        f"{source.name}: unknown architecture {label!r} (field 'architectures' / 'model_type'); "
        "register an adapter with pagedkv.models.register_model_adapter"
    )
