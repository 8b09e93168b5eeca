"""Names vLLM's tests import that belong to vLLM outside its KV cache layer.

``pagedkv.compat.vllm`` translates the KV cache layer only. The scheduler, KV connectors,
structured output, the engine core and HiSparse's host tier still have their vLLM import
paths here so a module that merely imports them loads; using one raises
``OutsideKVCacheLayerError`` naming the vLLM feature it stands for.
"""

from __future__ import annotations

from typing import Any, NoReturn

from pagedkv.errors import PagedKVError

__all__ = ["OutsideKVCacheLayerError", "outside_class", "outside_function"]


class OutsideKVCacheLayerError(PagedKVError, NotImplementedError):
    """A vLLM feature outside the KV cache layer was used through pagedkv.compat.vllm."""


def _refuse(name: str, feature: str) -> NoReturn:
    raise OutsideKVCacheLayerError(
        f"{name} is vLLM's {feature}, outside the KV cache layer that pagedkv.compat.vllm "
        "translates (docs/vllm-compat.md)"
    )


def outside_class(name: str, feature: str, module: str) -> type:
    """A class named ``name`` whose construction raises ``OutsideKVCacheLayerError``."""

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        _refuse(name, feature)

    return type(name, (), {"__init__": __init__, "__module__": module, "__doc__": feature})


def outside_function(name: str, feature: str, module: str) -> Any:
    """A function named ``name`` that raises ``OutsideKVCacheLayerError`` when called."""

    def refuse(*args: Any, **kwargs: Any) -> NoReturn:
        _refuse(name, feature)

    refuse.__name__ = refuse.__qualname__ = name
    refuse.__module__ = module
    refuse.__doc__ = feature
    return refuse
