"""Layer buckets, uniform detection, promotion and turning buckets into groups."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pagedkv.errors import KVCacheSpecError, PlanningError
from pagedkv.planning.types import KVCacheGroupSpec
from pagedkv.specs.base import KVCacheSpec, cdiv
from pagedkv.specs.full import FullAttentionSpec, MLAAttentionSpec
from pagedkv.specs.local import ChunkedLocalAttentionSpec, SlidingWindowMLASpec, SlidingWindowSpec
from pagedkv.specs.uniform import UniformTypeKVCacheSpecs


@dataclass(frozen=True)
class Bucket:
    """Layers whose specs merge into one group spec, in model order, with their specs."""

    layer_names: tuple[str, ...]
    specs: tuple[KVCacheSpec, ...]

    def __len__(self) -> int:
        return len(self.layer_names)

    @property
    def first(self) -> KVCacheSpec:
        return self.specs[0]


def merge_specs(specs: Sequence[KVCacheSpec]) -> KVCacheSpec:
    """One spec for a group: the first spec's class merges the distinct specs."""
    distinct = list(dict.fromkeys(specs))
    return type(distinct[0]).merge(distinct)


def try_merge(specs: Sequence[KVCacheSpec]) -> KVCacheSpec | None:
    try:
        return merge_specs(specs)
    except KVCacheSpecError:
        return None


def uniform_spec(kv_cache_spec: Mapping[str, KVCacheSpec]) -> KVCacheSpec | None:
    """The merged spec when every layer can share one plain group, else None."""
    return try_merge(list(kv_cache_spec.values()))


def make_buckets(kv_cache_spec: Mapping[str, KVCacheSpec]) -> list[Bucket]:
    """Bucket layers by equal spec, then merge buckets whose specs merge (window metadata)."""
    order = {name: i for i, name in enumerate(kv_cache_spec)}
    by_spec: dict[KVCacheSpec, list[str]] = {}
    for name, spec in kv_cache_spec.items():
        by_spec.setdefault(spec, []).append(name)
    merged: list[tuple[list[KVCacheSpec], list[str]]] = []
    for spec, names in by_spec.items():
        for distinct, bucket_names in merged:
            if try_merge([*distinct, spec]) is not None:
                distinct.append(spec)
                bucket_names.extend(names)
                break
        else:
            merged.append(([spec], list(names)))
    buckets = []
    for _, names in merged:
        names.sort(key=order.__getitem__)
        buckets.append(Bucket(tuple(names), tuple(kv_cache_spec[n] for n in names)))
    return buckets


def vllm_group_size(bucket_sizes: Sequence[int]) -> int:
    """vLLM's rule: the smallest bucket, unless the largest is under 1.5x of it."""
    smallest, largest = min(bucket_sizes), max(bucket_sizes)
    return largest if largest < 1.5 * smallest else smallest


def split_bucket(bucket: Bucket, group_size: int) -> list[KVCacheGroupSpec]:
    """``cdiv(len, group_size)`` groups taking layers by stride (balanced PP stages)."""
    num_groups = cdiv(len(bucket), group_size)
    groups = []
    for i in range(num_groups):
        names = bucket.layer_names[i::num_groups]
        spec = merge_specs(bucket.specs[i::num_groups])
        groups.append(KVCacheGroupSpec(layer_names=names, kv_cache_spec=spec))
    return groups


def groups_from_buckets(buckets: Sequence[Bucket], group_size: int) -> list[KVCacheGroupSpec]:
    return [group for bucket in buckets for group in split_bucket(bucket, group_size)]


def single_group(kv_cache_spec: Mapping[str, KVCacheSpec]) -> list[KVCacheGroupSpec] | None:
    """One plain group, or one uniform-type group, when the layers allow it."""
    names = tuple(kv_cache_spec)
    spec = uniform_spec(kv_cache_spec)
    if spec is not None:
        return [KVCacheGroupSpec(layer_names=names, kv_cache_spec=spec)]
    uniform_type = UniformTypeKVCacheSpecs.from_specs(kv_cache_spec)
    if uniform_type is not None:
        return [KVCacheGroupSpec(layer_names=names, kv_cache_spec=uniform_type)]
    return None


_ATTENTION_FIELDS = (
    "block_size",
    "is_draft",
    "num_kv_heads",
    "head_size",
    "dtype",
    "head_size_v",
    "page_size_padded",
    "state_content_bytes",
    "max_tp_shards",
)


def promote_to_full(spec: KVCacheSpec, block_size: int | None) -> KVCacheSpec:
    """A sliding-window or chunked layer as full attention (window kept as metadata)."""
    target: type[FullAttentionSpec]
    extra: dict[str, Any]
    if isinstance(spec, SlidingWindowMLASpec):
        target, extra = MLAAttentionSpec, {"sliding_window": spec.sliding_window}
    elif isinstance(spec, SlidingWindowSpec):
        target, extra = FullAttentionSpec, {"sliding_window": spec.sliding_window}
    elif isinstance(spec, ChunkedLocalAttentionSpec):
        target, extra = FullAttentionSpec, {"attention_chunk_size": spec.attention_chunk_size}
    else:
        return spec
    fields = {name: getattr(spec, name) for name in _ATTENTION_FIELDS}
    promoted = target(**fields, **extra)
    if block_size is not None and block_size != promoted.block_size:
        promoted = promoted.copy_with_new_block_size(block_size)
    return promoted


def promote_local_specs(kv_cache_spec: Mapping[str, KVCacheSpec]) -> dict[str, KVCacheSpec]:
    """Hybrid groups disabled: turn local layers into full attention so one group fits.

    Raises PlanningError naming the layers that still cannot share a group.
    """
    full_sizes = {
        s.block_size
        for s in kv_cache_spec.values()
        if isinstance(s, FullAttentionSpec) and not s.is_draft
    }
    block_size = next(iter(full_sizes)) if len(full_sizes) == 1 else None
    promoted = {name: promote_to_full(s, block_size) for name, s in kv_cache_spec.items()}
    if single_group(promoted) is None:
        kinds: dict[str, list[str]] = {}
        for name, spec in promoted.items():
            kinds.setdefault(spec.kind, []).append(name)
        detail = "; ".join(f"{k}: {', '.join(v[:4])}" for k, v in kinds.items())
        raise PlanningError(
            "hybrid KV cache groups are disabled (CacheConfig.enable_hybrid_kv_cache=False or "
            "the platform), but these layers cannot share one group even after promoting "
            f"local attention to full attention: {detail}"
        )
    return promoted


def with_retained_tokens(
    kv_cache_spec: Mapping[str, KVCacheSpec], lookahead_tokens: int
) -> dict[str, KVCacheSpec]:
    """Sliding-window layers keep ``lookahead - 1`` extra tokens for multi-token prefill."""
    extra = max(0, lookahead_tokens - 1)
    out: dict[str, KVCacheSpec] = {}
    for name, spec in kv_cache_spec.items():
        if isinstance(spec, SlidingWindowSpec) and spec.extra_retained_tokens < extra:
            spec = dataclasses.replace(spec, extra_retained_tokens=extra)
        out[name] = spec
    return out
