"""The Platform base class (the hooks pagedkv asks a hardware platform) and how
``package.module.Name`` strings resolve to the objects they name."""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import TYPE_CHECKING, Any

from pagedkv.errors import PlatformError

if TYPE_CHECKING:
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
        """Attention block sizes the kernels accept are multiples of this (used when the
        planner raises the attention block size of an attention + Mamba hybrid)."""
        return 1

    @classmethod
    def default_kv_cache_layout(cls) -> str:
        """Per-block layout of attention pages: 'NHD' (token-major) or 'HND' (head-major)."""
        return "NHD"


class GenericPlatform(Platform):
    name = "generic"


def _import(qualname: str, module_name: str) -> ModuleType | None:
    """The module, or None if it does not exist; other import failures raise PlatformError."""
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if module_name == missing or module_name.startswith(missing + "."):
            return None
        raise PlatformError(
            f"cannot resolve {qualname!r}: importing module {module_name!r} failed: "
            f"module {missing!r} not found"
        ) from exc
    except Exception as exc:
        raise PlatformError(
            f"cannot resolve {qualname!r}: importing module {module_name!r} failed: "
            f"{type(exc).__name__}: {exc}"
        ) from exc


def _split(qualname: str) -> tuple[ModuleType, str, list[str], str]:
    """The imported module, its name, the attribute path below it, the longest name tried."""
    if ":" in qualname:
        module_name, _, attr_path = qualname.partition(":")
        candidates = [(module_name, attr_path)] if module_name and attr_path else []
    else:
        parts = qualname.split(".")
        candidates = [
            (".".join(parts[:end]), ".".join(parts[end:])) for end in range(len(parts) - 1, 0, -1)
        ]
    if not candidates or not all(p for name, _ in candidates for p in name.split(".")):
        raise PlatformError(f"{qualname!r} is not a qualified name like 'pkg.module.Name'")
    for module_name, attr_path in candidates:
        module = _import(qualname, module_name)
        if module is not None:
            return module, module_name, attr_path.split("."), candidates[0][0]
    raise PlatformError(f"cannot resolve {qualname!r}: module {candidates[0][0]!r} not found")


def resolve_obj_by_qualname(qualname: str) -> Any:
    """Import ``module.path.Attr`` (``module.path:Attr.inner`` also accepted) and return it.

    Nested attributes work too (``pkg.module.Outer.Inner``): the longest importable
    module prefix is imported and the rest is looked up as attributes.
    """
    if not isinstance(qualname, str) or not qualname.strip():
        raise PlatformError(f"expected a qualified name like 'pkg.module.Name', got {qualname!r}")
    obj, path, attrs, longest = _split(qualname.strip())
    module_name = path
    for part in attrs:
        if not part or not hasattr(obj, part):
            missing_module = path == module_name != longest
            also = f" (and there is no module {longest!r})" if missing_module else ""
            raise PlatformError(
                f"cannot resolve {qualname!r}: {path!r} has no attribute {part!r}{also}"
            )
        obj = getattr(obj, part)
        path = f"{path}.{part}"
    return obj


def qualname_of(obj: Any) -> str:
    """``module.QualName`` of a class or function (what resolve_obj_by_qualname accepts)."""
    return f"{obj.__module__}.{obj.__qualname__}"
