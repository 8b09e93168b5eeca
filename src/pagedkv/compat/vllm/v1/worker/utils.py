"""vLLM's ``vllm.v1.worker.utils``: cross-layer KV sharing's group membership (pagedkv's
``planning.sharing``); the GPU worker's tensor allocation is outside the KV cache layer
(importable; using it raises ``OutsideKVCacheLayerError``)."""

from __future__ import annotations

from collections.abc import Mapping, MutableSet, Sequence
from typing import Any

from pagedkv.compat.vllm._outside import outside_function
from pagedkv.planning.sharing import layer_names_with_sharing

__all__ = ["add_kv_sharing_layers_to_kv_cache_groups", "allocate_kv_cache"]

allocate_kv_cache = outside_function("allocate_kv_cache", "GPU worker", __name__)


def add_kv_sharing_layers_to_kv_cache_groups(
    shared_kv_cache_layers: Mapping[str, str],
    kv_cache_groups: Sequence[Any],
    runner_only_attn_layers: MutableSet[str] | None = None,
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
