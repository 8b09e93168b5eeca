"""Cross-layer KV sharing (vLLM's ``kv_sharing_target_layer_name``): a layer that reads
another layer's cache has no spec of its own, so planning never sizes it; it joins its
target's group once the configs are placed, and its tensors are its target's."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping, Sequence

from pagedkv.errors import PlanningError
from pagedkv.planning.types import KVCacheConfig, KVCacheGroupSpec

__all__ = [
    "check_kv_sharing",
    "add_kv_sharing_layers",
    "layer_names_with_sharing",
]


def check_kv_sharing(shared: Mapping[str, str], layers_with_specs: Collection[str]) -> None:
    """PlanningError naming the first sharing layer whose pairing cannot hold."""
    for layer, target in shared.items():
        if layer == target:
            raise PlanningError(f"layer {layer!r} cannot share its own KV cache")
        if layer in layers_with_specs:
            raise PlanningError(
                f"layer {layer!r} shares the KV cache of {target!r} but has a KV cache spec "
                "of its own; a sharing layer must have none"
            )
        if target not in layers_with_specs:
            raise PlanningError(
                f"layer {layer!r} shares the KV cache of {target!r}, which has no KV cache "
                "spec (targets must own a cache; they cannot share one themselves)"
            )


def add_kv_sharing_layers(config: KVCacheConfig, shared: Mapping[str, str]) -> KVCacheConfig:
    """``config`` with the sharing layers whose target it holds joined to that target's
    group (``KVCacheConfig.group_layer_names``)."""
    own = {name for group in config.kv_cache_groups for name in group.layer_names}
    pairs = tuple((layer, target) for layer, target in shared.items() if target in own)
    if not pairs:
        return config
    return dataclasses.replace(config, shared_kv_cache_layers=pairs)


def layer_names_with_sharing(
    groups: Sequence[KVCacheGroupSpec], shared: Mapping[str, str]
) -> list[tuple[str, ...]]:
    """Each group's layer names followed by the layers reading one of its caches, in
    ``shared``'s order (vLLM appends them so the group's attention metadata reaches
    them); PlanningError naming a sharing layer whose target is in no group."""
    group_of = {name: i for i, g in enumerate(groups) for name in g.layer_names}
    names = [list(g.layer_names) for g in groups]
    for layer, target in shared.items():
        if target not in group_of:
            raise PlanningError(
                f"layer {layer!r} shares the KV cache of {target!r}, which is in no KV cache group"
            )
        names[group_of[target]].append(layer)
    return [tuple(n) for n in names]
