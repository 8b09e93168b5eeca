"""Finding the current platform and loading plugins through entry points."""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any

from pagedkv.errors import PlatformError
from pagedkv.platforms.interface import GenericPlatform, Platform
from pagedkv.platforms.qualname import qualname_of, resolve_obj_by_qualname
from pagedkv.registry import STARTUP_LOCK

if TYPE_CHECKING:
    from importlib.metadata import EntryPoint

logger = logging.getLogger(__name__)

PLATFORM_ENV = "PAGEDKV_PLATFORM"
PLATFORM_GROUP = "pagedkv.platforms"
PLUGIN_GROUP = "pagedkv.plugins"

_lock = STARTUP_LOCK  # shared with the registry: see pagedkv.registry
_current: type[Platform] | None = None
_plugins_loaded = False
_loaded_plugins: set[str] = set()


def entry_points(*, group: str) -> Any:
    # importlib.metadata costs ~50-90 ms to import: only pay it when discovery runs.
    from importlib.metadata import entry_points as _entry_points

    return _entry_points(group=group)


def _as_platform_class(obj: Any, origin: str) -> type[Platform] | None:
    """An entry point may name a Platform class, or a function returning a qualname or None."""
    if isinstance(obj, type):
        if not issubclass(obj, Platform):
            raise PlatformError(f"{origin}: {obj.__qualname__} is not a pagedkv Platform subclass")
        return obj
    if callable(obj):
        result = obj()
        if result is None:
            return None
        return _as_platform_class(
            resolve_obj_by_qualname(result) if isinstance(result, str) else result, origin
        )
    raise PlatformError(f"{origin}: expected a Platform class or a callable, got {obj!r}")


def _load_entry_point(ep: EntryPoint, group: str) -> Any:
    try:
        return ep.load()
    except Exception as exc:
        raise PlatformError(
            f"cannot load entry point {ep.name!r} ({ep.value}) of group {group!r}: {exc}"
        ) from exc


def _platform_from_env(value: str) -> type[Platform]:
    """``$PAGEDKV_PLATFORM``: ``generic``, an installed platform plugin's name, or a qualname."""
    origin = f"${PLATFORM_ENV}={value!r}"
    if value == GenericPlatform.name:
        return GenericPlatform
    for ep in entry_points(group=PLATFORM_GROUP):
        if ep.name == value:
            cls = _as_platform_class(_load_entry_point(ep, PLATFORM_GROUP), origin)
            if cls is None:
                raise PlatformError(f"{origin}: platform plugin {value!r} is not active here")
            return cls
    try:
        obj = resolve_obj_by_qualname(value)
    except PlatformError as exc:
        raise PlatformError(
            f"{origin} is neither 'generic', an installed platform plugin nor a "
            f"resolvable class: {exc}"
        ) from exc
    return _as_platform_class(obj, origin) or GenericPlatform


def _resolve_platform() -> type[Platform]:
    name = os.environ.get(PLATFORM_ENV, "").strip()
    if name:
        return _platform_from_env(name)
    active: list[tuple[str, type[Platform]]] = []
    for ep in entry_points(group=PLATFORM_GROUP):
        cls = _as_platform_class(
            _load_entry_point(ep, PLATFORM_GROUP), f"platform plugin {ep.name!r}"
        )
        if cls is not None:
            active.append((ep.name, cls))
    if len(active) > 1:
        names = ", ".join(f"{n} ({qualname_of(c)})" for n, c in active)
        raise PlatformError(
            f"more than one platform plugin is active: {names}; uninstall one or set "
            f"${PLATFORM_ENV} to the plugin name or platform class to use"
        )
    return active[0][1] if active else GenericPlatform


def get_current_platform() -> type[Platform]:
    """The platform class, resolved once: env var, else the one plugin, else generic."""
    global _current
    if _current is None:
        with _lock:
            if _current is None:
                _current = _resolve_platform()
    return _current


def set_current_platform(platform: type[Platform] | None) -> None:
    """Force a platform (None: resolve again on next use). For engines and tests."""
    global _current
    with _lock:
        _current = platform


def load_general_plugins(force: bool = False) -> list[str]:
    """Call every ``pagedkv.plugins`` entry point once per process; return the names called.

    A plugin that fails raises PlatformError naming it; the plugins already called
    are not called again, the rest are tried on the next call.
    """
    global _plugins_loaded
    with _lock:
        if force:
            _loaded_plugins.clear()
        elif _plugins_loaded:
            return []
        # Set first: a plugin that queries the registry must not re-enter loading.
        _plugins_loaded = True
        called: list[str] = []
        try:
            for ep in entry_points(group=PLUGIN_GROUP):
                key = f"{ep.name}={ep.value}"
                if key in _loaded_plugins:
                    continue
                _loaded_plugins.add(key)
                _call_plugin(ep)
                called.append(ep.name)
        except BaseException:
            _plugins_loaded = False
            raise
        return called


def _call_plugin(ep: EntryPoint) -> None:
    func = _load_entry_point(ep, PLUGIN_GROUP)
    if not callable(func):
        raise PlatformError(f"plugin {ep.name!r} ({ep.value}) is not callable")
    try:
        func()
    except PlatformError:
        raise
    except Exception as exc:
        raise PlatformError(
            f"plugin {ep.name!r} ({ep.value}) failed: {type(exc).__name__}: {exc}"
        ) from exc
    logger.debug("loaded pagedkv plugin %s", ep.name)


def loaded_plugins() -> list[str]:
    """``name=value`` of every general plugin called so far."""
    with _lock:
        return sorted(_loaded_plugins)


def reset_plugins() -> None:
    """Forget that plugins were loaded, so the next load calls them all again (tests)."""
    global _plugins_loaded
    with _lock:
        _plugins_loaded = False
        _loaded_plugins.clear()
