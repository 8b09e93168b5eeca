"""KV cache layouts: the order of the dimensions of every group's bytes. vLLM 0.33 names
them as permutations of ``[L, B, H, N, C]`` (layer, block, head, token, content); pagedkv
also accepts ``NHD`` / ``HND`` (layer-outermost, tokens or heads first inside a page)."""

from __future__ import annotations

from pagedkv.config import EngineConfig
from pagedkv.errors import ConfigError
from pagedkv.platforms import get_current_platform

# vLLM 0.33's layouts, then pagedkv's per-page names (layer-outermost).
KV_CACHE_LAYOUTS = ("LBHNC", "LBNHC", "LHBNC", "BLHNC", "BLNHC", "BHLNC", "NHD", "HND")


def resolve_kv_cache_layout(config: EngineConfig) -> str:
    """CacheConfig.kv_cache_layout, else the platform's default (ConfigError if unknown)."""
    name = config.cache.kv_cache_layout or get_current_platform().default_kv_cache_layout()
    layout = str(name).upper()
    if layout not in KV_CACHE_LAYOUTS:
        raise ConfigError(
            f"CacheConfig.kv_cache_layout must be one of {', '.join(KV_CACHE_LAYOUTS)}, "
            f"got {name!r}"
        )
    return layout


def is_block_outermost(layout: str) -> bool:
    """Whether a block's bytes for every layer of a group lie together (``B`` first):
    then the groups' blocks all have one stride and groups of different page sizes pack
    side by side in it (vLLM's packed grouping) instead of being unified to one page."""
    return layout.startswith("B")
