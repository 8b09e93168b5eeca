"""Workers: merging their specs, projecting global groups onto them, TP replicas."""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence

from pagedkv.errors import PlanningError
from pagedkv.planning.types import KVCacheGroupSpec
from pagedkv.specs.base import AttentionSpec, KVCacheSpec
from pagedkv.specs.full import MLAAttentionSpec
from pagedkv.specs.local import SlidingWindowMLASpec
from pagedkv.specs.uniform import UniformTypeKVCacheSpecs


def merge_worker_specs(
    kv_cache_specs_per_worker: Sequence[Mapping[str, KVCacheSpec]],
) -> dict[str, KVCacheSpec]:
    """All workers' layers by name; one name with different specs is an error."""
    merged: dict[str, KVCacheSpec] = {}
    owner: dict[str, int] = {}
    for worker, specs in enumerate(kv_cache_specs_per_worker):
        for name, spec in specs.items():
            seen = merged.get(name)
            if seen is None:
                merged[name] = spec
                owner[name] = worker
            elif seen is not spec and seen != spec:
                raise PlanningError(
                    f"layer {name!r} has different KV cache specs on worker {owner[name]} "
                    f"({seen!r}) and worker {worker} ({spec!r})"
                )
    return merged


def project_groups(
    groups: Sequence[KVCacheGroupSpec], worker_layers: Collection[str]
) -> list[KVCacheGroupSpec]:
    """The global groups restricted to one worker's layers (a group may become empty).

    Every worker keeps every group so group ids agree across pipeline stages.
    """
    out = []
    for group in groups:
        names = tuple(n for n in group.layer_names if n in worker_layers)
        if len(names) == len(group.layer_names):
            out.append(group)
            continue
        spec = group.kv_cache_spec
        if isinstance(spec, UniformTypeKVCacheSpecs) and names:
            spec = UniformTypeKVCacheSpecs(
                block_size=spec.block_size,
                kv_cache_specs={n: spec.kv_cache_specs[n] for n in names},
            )
        out.append(
            KVCacheGroupSpec(
                layer_names=names,
                kv_cache_spec=spec,
                role=group.role,
                host_resident=group.host_resident,
            )
        )
    return out


def _layer_replicas(spec: KVCacheSpec, tp: int) -> int:
    if not isinstance(spec, AttentionSpec):
        return 1
    shards = spec.max_tp_shards
    if shards is None and isinstance(spec, MLAAttentionSpec | SlidingWindowMLASpec):
        shards = 1  # one latent per token: every rank holds all of it
    return 1 if shards is None else max(1, tp // shards)


def kv_tp_replicas(groups: Sequence[KVCacheGroupSpec], tensor_parallel_size: int) -> int:
    """How many TP ranks hold identical KV (gcd of tp and every layer's replica count)."""
    values = {
        _layer_replicas(spec, tensor_parallel_size)
        for group in groups
        for spec in group.layer_specs().values()
    }
    return math.gcd(tensor_parallel_size, *values) if values else 1
