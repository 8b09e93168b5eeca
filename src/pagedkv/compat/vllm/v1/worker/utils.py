"""vLLM's ``vllm.v1.worker.utils``: the KV cache's backing allocation and per-layer views
(pagedkv's ``tensors.allocation``) and cross-layer KV sharing's group membership
(pagedkv's ``planning.sharing``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from pagedkv.compat.vllm.config._engine_config import layout_name
from pagedkv.planning.sharing import layer_names_with_sharing

__all__ = ["add_kv_sharing_layers_to_kv_cache_groups", "allocate_kv_cache"]


def allocate_kv_cache(
    kv_cache_config: Any,
    device: Any,
    layout: Any,
    kernel_block_sizes: Sequence[int] | None = None,
) -> dict[str, Any]:
    """One zeroed backing allocation for ``kv_cache_config`` on ``device`` and each
    layer's view into it under ``layout`` (pagedkv's allocation): a layer with one
    tensor maps to it, one with several (Mamba states) to their tuple."""
    from pagedkv.tensors import allocation

    if not kv_cache_config.kv_cache_tensors:
        return {}
    name = layout_name(layout) or kv_cache_config.kv_cache_layout
    config = dataclasses.replace(kv_cache_config, kv_cache_layout=name)
    memory = allocation.allocate_kv_cache(config, device)
    return {
        layer: view.tensors[0] if len(view.tensors) == 1 else view.tensors
        for layer, view in memory.layers.items()
    }


def add_kv_sharing_layers_to_kv_cache_groups(
    shared_kv_cache_layers: Mapping[str, str],
    kv_cache_groups: Sequence[Any],
    runner_only_attn_layers: set[str] | None = None,
) -> None:
    """Each sharing layer joins (in place) the group of the layer whose cache it reads;
    with ``runner_only_attn_layers``, it is recorded there too."""
    if not shared_kv_cache_layers:
        return
    for group, names in zip(
        kv_cache_groups, layer_names_with_sharing(kv_cache_groups, shared_kv_cache_layers)
    ):
        if len(names) != len(group.layer_names):
            group.layer_names = names
    if runner_only_attn_layers is not None:
        runner_only_attn_layers.update(shared_kv_cache_layers)
