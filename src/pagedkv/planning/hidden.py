"""Hidden-state cache layers in vLLM's grouping: planned apart from the attention
buckets, each in a group of its own whose page is the other groups' common page."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

from pagedkv.planning.types import KVCacheGroupSpec
from pagedkv.specs.base import KVCacheSpec, cdiv
from pagedkv.specs.hidden import HiddenStateCacheSpec
from pagedkv.specs.uniform import UniformTypeKVCacheSpecs

__all__ = [
    "split_hidden",
    "add_hidden_groups",
]


def split_hidden(
    kv_cache_spec: Mapping[str, KVCacheSpec],
) -> tuple[dict[str, KVCacheSpec], dict[str, HiddenStateCacheSpec]]:
    """(the other layers, the hidden-state layers), each in model order."""
    hidden = {n: s for n, s in kv_cache_spec.items() if isinstance(s, HiddenStateCacheSpec)}
    return {n: s for n, s in kv_cache_spec.items() if n not in hidden}, hidden


def _largest_divisor_at_most(value: int, limit: int) -> int:
    return next((d for d in range(min(value, limit), 0, -1) if value % d == 0), 1)


def _scaled(spec: KVCacheSpec, scale: int) -> KVCacheSpec:
    if isinstance(spec, UniformTypeKVCacheSpecs):
        return spec.copy_with_new_block_size(spec.block_size * scale)
    changes: dict[str, int] = {"block_size": spec.block_size * scale}
    padded = getattr(spec, "page_size_padded", None)
    if padded is not None:
        changes["page_size_padded"] = padded * scale
    return dataclasses.replace(spec, **changes)  # type: ignore[arg-type]


def add_hidden_groups(
    groups: Sequence[KVCacheGroupSpec], hidden: Mapping[str, HiddenStateCacheSpec]
) -> list[KVCacheGroupSpec]:
    """``groups`` (block sizes scaled up when a hidden state's token outgrows their common
    page), then one group per hidden-state layer: the largest block size dividing the
    groups' gcd whose tokens fit the page, padded to it (vLLM's rule)."""
    out = list(groups)
    if not hidden:
        return out
    page = max(g.kv_cache_spec.page_size_bytes for g in out)
    largest = max(s.per_token_bytes for s in hidden.values())
    if largest > page:
        scale = cdiv(largest, page)
        page *= scale
        out = [dataclasses.replace(g, kv_cache_spec=_scaled(g.kv_cache_spec, scale)) for g in out]
    gcd_block = math.gcd(*(g.kv_cache_spec.block_size for g in out))
    for name, spec in hidden.items():
        fit = max(page // spec.per_token_bytes, 1)
        block_size = _largest_divisor_at_most(gcd_block, fit)
        aligned = dataclasses.replace(spec, block_size=block_size, page_size_padded=page)
        out.append(KVCacheGroupSpec(layer_names=(name,), kv_cache_spec=aligned))
    return out
