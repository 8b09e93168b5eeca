"""Model adapters: one per architecture family, registered by architecture or model type."""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TypeVar

from pagedkv.errors import RegistryError
from pagedkv.models.layers import ModelLayout
from pagedkv.models.source import ModelSource
from pagedkv.models.view import ConfigView

A = TypeVar("A", bound="type[ModelAdapter]")

_lock = threading.RLock()
_adapters: dict[str, type[ModelAdapter]] = {}


class ModelAdapter(ABC):
    """Reads one architecture family's config into a ModelLayout.

    ``view`` is the text config (published values first, transformers' normalised
    ones filling gaps); ``source`` gives the whole file (for wrapper-level fields).
    """

    @abstractmethod
    def describe(self, view: ConfigView, source: ModelSource) -> ModelLayout:
        """The model's cache layers and parameter counts."""


def register_model_adapter(*names: str, override: bool = False) -> Callable[[A], A]:
    """Class decorator: the adapter for configs whose architecture or model_type is in ``names``.

    Registering a name twice with a different class raises unless ``override``.
    """
    if not names:
        raise RegistryError("register_model_adapter needs at least one architecture name")

    def decorate(cls: A) -> A:
        if not (isinstance(cls, type) and issubclass(cls, ModelAdapter)):
            raise RegistryError(f"{cls!r} is not a ModelAdapter subclass")
        with _lock:
            for name in names:
                current = _adapters.get(name)
                if current is not None and current is not cls and not override:
                    raise RegistryError(
                        f"model adapter for {name!r} is already {current.__qualname__}; "
                        "pass override=True to replace it"
                    )
            for name in names:
                _adapters[name] = cls
        return cls

    return decorate


def unregister_model_adapter(name: str) -> None:
    """Remove one name's registration (tests and plugins that replace one)."""
    with _lock:
        _adapters.pop(name, None)
