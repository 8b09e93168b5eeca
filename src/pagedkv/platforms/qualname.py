"""Resolve ``package.module.Name`` strings to objects, with errors that say what is missing."""

from __future__ import annotations

import importlib
from typing import Any

from pagedkv.errors import PlatformError


def resolve_obj_by_qualname(qualname: str) -> Any:
    """Import ``module.path.Attr`` (``module.path:Attr.inner`` also accepted) and return it."""
    if not isinstance(qualname, str) or not qualname.strip():
        raise PlatformError(f"expected a qualified name like 'pkg.module.Name', got {qualname!r}")
    if ":" in qualname:
        module_name, _, attr_path = qualname.partition(":")
    else:
        module_name, _, attr_path = qualname.rpartition(".")
    if not module_name or not attr_path:
        raise PlatformError(f"{qualname!r} is not a qualified name like 'pkg.module.Name'")
    try:
        obj: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise PlatformError(
            f"cannot resolve {qualname!r}: module {module_name!r} not found ({exc.name} missing)"
        ) from exc
    for part in attr_path.split("."):
        if not hasattr(obj, part):
            raise PlatformError(
                f"cannot resolve {qualname!r}: {module_name!r} has no attribute {attr_path!r}"
            )
        obj = getattr(obj, part)
    return obj


def qualname_of(obj: Any) -> str:
    return f"{obj.__module__}.{obj.__qualname__}"
