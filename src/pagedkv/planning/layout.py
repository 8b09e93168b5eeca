"""KV cache layouts: the order of the dimensions of every group's bytes. vLLM 0.33 names
them as permutations of ``[L, B, H, N, C]`` (layer, block, head, token, content); pagedkv
also accepts ``NHD`` / ``HND`` (layer-outermost, tokens or heads first inside a page)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from pagedkv.config import EngineConfig
from pagedkv.errors import ConfigError, PlanningError
from pagedkv.platforms import get_current_platform

__all__ = [
    "KV_CACHE_LAYOUTS",
    "resolve_kv_cache_layout",
    "is_block_outermost",
    "is_block_compact",
    "check_layout_expresses",
    "group_page_sizes",
    "choose_kv_cache_layout",
]

if TYPE_CHECKING:
    from pagedkv.planning.types import KVCacheGroupSpec

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


def is_block_compact(layout: str) -> bool:
    """Whether each page is one contiguous run of bytes (layer and block dims outermost)."""
    return layout[:2] in ("LB", "BL")


def check_layout_expresses(layout: str, groups: Sequence[KVCacheGroupSpec]) -> None:
    """vLLM 0.33's rule for its layout names: layers of different page sizes need a
    block-compact layout, and several groups then need the block dim outermost
    (PlanningError naming the layout and the page sizes). pagedkv's own ``NHD`` /
    ``HND`` names place such groups block-outer instead."""
    if layout in ("NHD", "HND"):
        return
    pages = {page for group in groups for page in group_page_sizes(group)}
    if len(pages) <= 1:
        return
    if not is_block_compact(layout) or (len(groups) > 1 and layout.startswith("L")):
        raise PlanningError(
            f"KV cache layout {layout} cannot express this model's mixed page sizes "
            f"({sorted(pages)}); choose a block-outermost layout such as BLHNC"
        )


def group_page_sizes(group: KVCacheGroupSpec) -> set[int]:
    """The distinct page sizes of a group's layers."""
    return {spec.page_size_bytes for spec in group.layer_specs().values()}


def choose_kv_cache_layout(
    supported: Sequence[str], page_sizes: Sequence[int], requested: str | None = None
) -> str:
    """vLLM 0.33's choice among the layouts every backend supports (most preferred
    first): pages of several sizes narrow it to block-compact layouts; ``requested``
    must then be one of them, else the first remaining is taken (ConfigError when
    nothing is left)."""
    candidates = [name.upper() for name in supported]
    unknown = [name for name in candidates if name not in KV_CACHE_LAYOUTS[:6]]
    if not candidates or unknown:
        raise ConfigError(
            f"supported KV cache layouts must be non-empty names among "
            f"{', '.join(KV_CACHE_LAYOUTS[:6])}, got {list(supported)!r}"
        )
    if len(set(page_sizes)) > 1:
        candidates = [name for name in candidates if is_block_compact(name)]
        if not candidates:
            raise ConfigError(
                f"layers with mixed page sizes need a block-compact KV cache layout, but "
                f"none of {list(supported)!r} is one"
            )
    if requested is None:
        return candidates[0]
    if requested.upper() not in candidates:
        raise ConfigError(
            f"requested KV cache layout {requested!r} is not among the usable layouts "
            f"{candidates!r}"
        )
    return requested.upper()
