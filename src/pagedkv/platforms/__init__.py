"""Platform hooks, plugin discovery and qualified-name resolution (``current_platform`` lazily)."""

from typing import Any

from pagedkv.platforms.discovery import (
    PLATFORM_ENV,
    PLATFORM_GROUP,
    PLUGIN_GROUP,
    PLUGINS_ENV,
    get_current_platform,
    load_general_plugins,
    set_current_platform,
)
from pagedkv.platforms.interface import (
    DEFAULT_BUILDER_QUALNAME,
    GenericPlatform,
    Platform,
    qualname_of,
    resolve_obj_by_qualname,
)


def __getattr__(name: str) -> Any:
    if name == "current_platform":
        return get_current_platform()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
