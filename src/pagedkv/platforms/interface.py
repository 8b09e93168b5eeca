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
