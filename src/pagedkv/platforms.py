"""Platforms: the hooks pagedkv asks a hardware platform (``Platform``), how
``package.module.Name`` strings resolve to the objects they name, finding the current
platform and loading plugins through entry points (``current_platform`` resolves lazily).

``$PAGEDKV_PLUGINS`` is the allow-list, as vLLM's ``VLLM_PLUGINS``: unset, every plugin
loads; a comma-separated list, only those; an empty string, none.
"""

from __future__ import annotations

import importlib
import logging
import os
from types import ModuleType
from typing import TYPE_CHECKING, Any

from pagedkv.errors import PlatformError
from pagedkv.registry import STARTUP_LOCK

__all__ = [
    "DEFAULT_BUILDER_QUALNAME",
    "Platform",
    "GenericPlatform",
    "resolve_obj_by_qualname",
    "qualname_of",
    "logger",
    "PLATFORM_ENV",
    "PLUGINS_ENV",
    "PLATFORM_GROUP",
    "PLUGIN_GROUP",
    "entry_points",
    "get_current_platform",
    "set_current_platform",
    "load_general_plugins",
]

if TYPE_CHECKING:
    from importlib.metadata import EntryPoint

    from pagedkv.config import EngineConfig

DEFAULT_BUILDER_QUALNAME = "pagedkv.planning.builder.DefaultKVCacheConfigBuilder"


class Platform:
    """Hooks a platform can override. All are classmethods; platforms hold no state."""

    name: str = "generic"

    @classmethod
    def register_custom_kv_cache_specs(cls, config: EngineConfig | None) -> None:
        """Register the platform's own spec classes (runs after the built-ins)."""

    @classmethod
    def get_kv_cache_config_builder_cls(cls, config: EngineConfig | None) -> str:
        """Qualified name of the builder: the model's declared one, else the default."""
        if config is not None and config.model.kv_cache_config_builder:
            return config.model.kv_cache_config_builder
        return DEFAULT_BUILDER_QUALNAME

    @classmethod
    def support_hybrid_kv_cache(cls) -> bool:
        """Whether layers of several kinds may keep separate KV cache groups."""
        return True

    @classmethod
    def kv_cache_block_size_multiple(cls, config: EngineConfig | None) -> int:
        """Attention block sizes the kernels accept are multiples of this."""
        return 1

    @classmethod
    def default_kv_cache_layout(cls) -> str:
        """Per-block layout of attention pages: 'NHD' (token-major) or 'HND' (head-major)."""
        return "NHD"


class GenericPlatform(Platform):
    name = "generic"


def _import(qualname: str, module_name: str) -> ModuleType | None:
    try:
        return importlib.import_module(module_name)
    except Exception as exc:
        why = f"{type(exc).__name__}: {exc}"
        if isinstance(exc, ModuleNotFoundError):
            missing = exc.name or ""
            if module_name == missing or module_name.startswith(missing + "."):
                return None
            why = f"module {missing!r} not found"
        raise PlatformError(
            f"cannot resolve {qualname!r}: importing module {module_name!r} failed: {why}"
        ) from exc


def resolve_obj_by_qualname(qualname: str) -> Any:
    """Import ``module.path.Attr`` (or ``module.path:Attr.inner``) and return it."""
    if not isinstance(qualname, str) or not qualname.strip():
        raise PlatformError(f"expected a qualified name like 'pkg.module.Name', got {qualname!r}")
    text = qualname.strip()
    module_part, colon, attr_part = text.partition(":")
    parts = text.replace(":", ".").split(".")
    ends = [module_part.count(".") + 1] if colon else list(range(len(parts) - 1, 0, -1))
    if not ends or not all(parts) or (colon and ":" in attr_part):
        raise PlatformError(f"{text!r} is not a qualified name like 'pkg.module.Name'")
    longest = ".".join(parts[: ends[0]])
    for end in ends:
        obj = _import(text, ".".join(parts[:end]))
        if obj is not None:
            break
    else:
        raise PlatformError(f"cannot resolve {text!r}: module {longest!r} not found")
    path = module = ".".join(parts[:end])
    for part in parts[end:]:
        if not hasattr(obj, part):
            also = f" (and there is no module {longest!r})" if path == module != longest else ""
            raise PlatformError(
                f"cannot resolve {text!r}: {path!r} has no attribute {part!r}{also}"
            )
        obj = getattr(obj, part)
        path = f"{path}.{part}"
    return obj


def qualname_of(obj: Any) -> str:
    """``module.QualName`` of a class or function (what resolve_obj_by_qualname accepts)."""
    return f"{obj.__module__}.{obj.__qualname__}"


# --- the current platform and plugins ---

logger = logging.getLogger(__name__)

PLATFORM_ENV = "PAGEDKV_PLATFORM"
PLUGINS_ENV = "PAGEDKV_PLUGINS"
PLATFORM_GROUP = "pagedkv.platforms"
PLUGIN_GROUP = "pagedkv.plugins"

# Process-wide start-up state, guarded by the registry's lock (see pagedkv.registry).
_state: dict[str, Any] = {"platform": None, "plugins_done": False, "plugin_error": None}
_loaded_plugins: set[str] = set()


def entry_points(*, group: str, allowed_only: bool = True) -> list[EntryPoint]:
    """Installed entry points of ``group`` (only those ``$PAGEDKV_PLUGINS`` allows)."""
    # importlib.metadata costs ~50-90 ms to import: only pay it when discovery runs.
    from importlib.metadata import entry_points as _entry_points

    found = list(_entry_points(group=group))
    allowed = os.environ.get(PLUGINS_ENV)
    if allowed is None or not allowed_only:
        return found
    names = {name.strip() for name in allowed.split(",")}
    logger.debug("$%s=%r: loading %s plugins %s", PLUGINS_ENV, allowed, group, names)
    return [ep for ep in found if ep.name in names]


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _as_platform_class(obj: Any, origin: str) -> type[Platform] | None:
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
            f"cannot load entry point {ep.name!r} ({ep.value}) of group {group!r}: "
            + _one_line(str(exc))
        ) from exc


def _platform_from_env(value: str) -> type[Platform]:
    # An explicit choice: the allow-list does not apply.
    origin = f"${PLATFORM_ENV}={value!r}"
    if value == GenericPlatform.name:
        return GenericPlatform
    for ep in entry_points(group=PLATFORM_GROUP, allowed_only=False):
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
            f"more than one platform plugin is active: {names}; uninstall one, set "
            f"${PLATFORM_ENV} to the plugin name or platform class to use, or list the "
            f"plugins to load in ${PLUGINS_ENV}"
        )
    return active[0][1] if active else GenericPlatform


def get_current_platform() -> type[Platform]:
    """The platform class, resolved once: env var, else the one plugin, else generic."""
    current = _state["platform"]
    if current is None:
        with STARTUP_LOCK:
            if _state["platform"] is None:
                _state["platform"] = _resolve_platform()
            current = _state["platform"]
    resolved: type[Platform] = current
    return resolved


def set_current_platform(platform: type[Platform] | None) -> None:
    """Force a platform (None: resolve again on next use). For engines and tests."""
    with STARTUP_LOCK:
        _state["platform"] = platform


def load_general_plugins() -> list[str]:
    """Call every allowed ``pagedkv.plugins`` entry point once per process; returns the
    names called now. A failure raises PlatformError now and on every later call."""
    with STARTUP_LOCK:
        if not _state["plugins_done"]:
            # Set first: a plugin that queries the registry must not re-enter loading.
            _state["plugins_done"] = True
            try:
                called = _call_plugins()
            except BaseException:  # interrupted: let the next call try the rest
                _state["plugins_done"] = False
                raise
        else:
            called = []
        if _state["plugin_error"] is not None:
            raise PlatformError(_state["plugin_error"])
        return called


def _call_plugins() -> list[str]:
    called: list[str] = []
    for ep in entry_points(group=PLUGIN_GROUP):
        key = f"{ep.name}={ep.value}"
        if key in _loaded_plugins:
            continue
        _loaded_plugins.add(key)
        try:
            func = _load_entry_point(ep, PLUGIN_GROUP)
            if not callable(func):
                raise PlatformError(f"plugin {ep.name!r} ({ep.value}) is not callable")
            func()
        except Exception as exc:
            why = f"plugin {ep.name!r} ({ep.value}) failed: {type(exc).__name__}: {exc}"
            message = str(exc) if isinstance(exc, PlatformError) else why
            _state["plugin_error"] = _state["plugin_error"] or _one_line(message)
            logger.debug("pagedkv plugin %s failed", ep.name, exc_info=True)
            continue
        called.append(ep.name)
    return called


def __getattr__(name: str) -> Any:
    if name == "current_platform":
        return get_current_platform()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
