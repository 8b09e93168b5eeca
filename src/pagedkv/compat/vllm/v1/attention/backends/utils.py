"""vLLM's ``vllm.v1.attention.backends.utils``: resolving the model's KV cache layout
(pagedkv's ``planning.layout`` rule) and recording it on the cache config."""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from typing import Any

from pagedkv.compat.vllm.config._engine_config import layout_name
from pagedkv.compat.vllm.v1.kv_cache_layout import KVCacheLayout
from pagedkv.errors import ConfigError
from pagedkv.planning.layout import choose_kv_cache_layout

__all__ = ["resolve_kv_cache_layout"]


def resolve_kv_cache_layout(
    vllm_config: Any,
    supported_layouts: Sequence[Sequence[str]],
    kv_cache_specs: Iterable[Any] | None = None,
) -> KVCacheLayout:
    """The one layout of the model: the config's when set, else pagedkv's choice among
    the layouts every worker supports (``VLLM_KV_CACHE_LAYOUT`` requests one), recorded
    on ``vllm_config.cache_config``."""
    cache = vllm_config.cache_config
    if cache.kv_cache_layout is not None:
        return KVCacheLayout[layout_name(cache.kv_cache_layout) or ""]
    if not supported_layouts or not all(supported_layouts):
        raise ValueError("No worker reported supported KV cache layouts.")
    if any(list(names) != list(supported_layouts[0]) for names in supported_layouts[1:]):
        raise ValueError(f"Workers disagree on supported KV cache layouts: {supported_layouts}.")
    pages = [spec.page_size_bytes for spec in kv_cache_specs or ()]
    requested = layout_name(os.environ.get("VLLM_KV_CACHE_LAYOUT"))
    try:
        name = choose_kv_cache_layout(
            [layout_name(n) or "" for n in supported_layouts[0]], pages, requested
        )
    except ConfigError as exc:
        raise ValueError(str(exc)) from exc
    cache.kv_cache_layout = name
    return KVCacheLayout[name]
