"""Start-up registration, in order: built-ins, the platform's specs, general plugins.

Called once by the registry on first use (by name, so the registry imports nothing above it).
"""

from __future__ import annotations

from typing import Any

from pagedkv.platforms import get_current_platform, load_general_plugins

__all__ = [
    "register_all",
]


def register_all(config: Any = None) -> None:
    from pagedkv.runtime.builtins import register_builtin_kv_cache_specs

    register_builtin_kv_cache_specs()
    get_current_platform().register_custom_kv_cache_specs(config)
    load_general_plugins()
