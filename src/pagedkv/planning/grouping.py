"""Layers into KV cache groups: buckets of mergeable specs, one group when the layers
allow it, else the searched hybrid (``search``); the alternatives it scored; and the
exact-partition check the planner runs on any builder's groups."""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from pagedkv.config import EngineConfig
from pagedkv.errors import KVCacheSpecError, PlanningError
from pagedkv.planning.search import Bucket, Scored, SearchResult, group_budget, search
from pagedkv.planning.types import GroupingAlternative, KVCacheGroupSpec
from pagedkv.specs.base import KVCacheSpec, cdiv
from pagedkv.specs.full import FullAttentionSpec, MLAAttentionSpec
from pagedkv.specs.local import ChunkedLocalAttentionSpec, SlidingWindowMLASpec, SlidingWindowSpec
from pagedkv.specs.uniform import UniformTypeKVCacheSpecs

# Length used to score groupings when max_model_len is -1 (the planner re-scores
# at the fitted length).
DEFAULT_REFERENCE_LEN = 32768
MAX_ALTERNATIVES = 8


def merge_specs(specs: Sequence[KVCacheSpec]) -> KVCacheSpec:
    """One spec for a group: the first spec's class merges the distinct specs."""
    distinct = list(dict.fromkeys(specs))
    return type(distinct[0]).merge(distinct)


def try_merge(specs: Sequence[KVCacheSpec]) -> KVCacheSpec | None:
    try:
        return merge_specs(specs)
    except KVCacheSpecError:
        return None


def make_buckets(kv_cache_spec: Mapping[str, KVCacheSpec]) -> list[Bucket]:
    """Layers in model order, bucketed by equal spec; a new spec joins the first bucket
    whose specs it merges with (window metadata)."""
    merged: list[tuple[list[KVCacheSpec], list[str]]] = []
    bucket_of: dict[KVCacheSpec, int] = {}
    for name, spec in kv_cache_spec.items():
        if spec not in bucket_of:
            fits = (i for i, (d, _) in enumerate(merged) if try_merge([*d, spec]) is not None)
            bucket_of[spec] = next(fits, len(merged))
            if bucket_of[spec] == len(merged):
                merged.append(([], []))
            merged[bucket_of[spec]][0].append(spec)
        merged[bucket_of[spec]][1].append(name)
    return [Bucket(tuple(names), tuple(kv_cache_spec[n] for n in names)) for _, names in merged]


def groups_from_buckets(buckets: Sequence[Bucket], group_size: int) -> list[KVCacheGroupSpec]:
    """Each bucket in ``cdiv(len, group_size)`` groups taking layers by stride (balanced
    pipeline stages)."""
    return [
        KVCacheGroupSpec(layer_names=b.layer_names[i::n], kv_cache_spec=merge_specs(b.specs[i::n]))
        for b in buckets
        for n in [cdiv(len(b), group_size)]
        for i in range(n)
    ]


def single_group(kv_cache_spec: Mapping[str, KVCacheSpec]) -> list[KVCacheGroupSpec] | None:
    """One plain group, or one uniform-type group, when the layers allow it."""
    names = tuple(kv_cache_spec)
    spec = try_merge(list(kv_cache_spec.values()))
    if spec is None:
        spec = UniformTypeKVCacheSpecs.from_specs(kv_cache_spec)
    return None if spec is None else [KVCacheGroupSpec(layer_names=names, kv_cache_spec=spec)]


_ATTENTION_FIELDS = (
    "block_size", "is_draft", "num_kv_heads", "head_size", "dtype",
    "head_size_v", "page_size_padded", "state_content_bytes", "max_tp_shards",
)  # fmt: skip


def promote_to_full(spec: KVCacheSpec, block_size: int | None) -> KVCacheSpec:
    """A sliding-window or chunked layer as full attention (window kept as metadata)."""
    target: type[FullAttentionSpec] = FullAttentionSpec
    extra: dict[str, Any]
    if isinstance(spec, SlidingWindowMLASpec):
        target, extra = MLAAttentionSpec, {"sliding_window": spec.sliding_window}
    elif isinstance(spec, SlidingWindowSpec):
        extra = {"sliding_window": spec.sliding_window}
    elif isinstance(spec, ChunkedLocalAttentionSpec):
        extra = {"attention_chunk_size": spec.attention_chunk_size}
    else:
        return spec
    promoted = target(**{name: getattr(spec, name) for name in _ATTENTION_FIELDS}, **extra)
    if block_size is not None and block_size != promoted.block_size:
        promoted = promoted.copy_with_new_block_size(block_size)
    return promoted


def promote_local_specs(kv_cache_spec: Mapping[str, KVCacheSpec]) -> dict[str, KVCacheSpec]:
    """Hybrid groups disabled: local layers as full attention so one group fits
    (PlanningError naming the layers that still cannot share one)."""
    specs = kv_cache_spec.values()
    full_sizes = {
        s.block_size for s in specs if isinstance(s, FullAttentionSpec) and not s.is_draft
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
    return {
        name: dataclasses.replace(spec, extra_retained_tokens=extra)
        if isinstance(spec, SlidingWindowSpec) and spec.extra_retained_tokens < extra
        else spec
        for name, spec in kv_cache_spec.items()
    }


def _names(items: Iterable[str], limit: int = 8) -> str:
    ordered = sorted(items)
    shown = ", ".join(repr(n) for n in ordered[:limit])
    return shown + (f" (+{len(ordered) - limit} more)" if len(ordered) > limit else "")


def check_exact_partition(
    groups: Sequence[KVCacheGroupSpec], layer_names: Iterable[str], *, source: str = "builder"
) -> None:
    """Every layer in exactly one group, and no group naming an unknown layer
    (PlanningError naming the duplicated, missing and unknown layers)."""
    counts = Counter(name for group in groups for name in group.layer_names)
    expected = set(layer_names)
    problems = [
        f"{what}: {_names(names)}"
        for what, names in (
            ("layers in more than one group", [n for n, c in counts.items() if c > 1]),
            ("layers in no group", expected - counts.keys()),
            ("groups name layers that have no KV cache spec", counts.keys() - expected),
        )
        if names
    ]
    if problems:
        raise PlanningError(
            f"KV cache groups from the {source} are not an exact partition of the layers: "
            + "; ".join(problems)
        )


class GroupingChoice(NamedTuple):
    groups: tuple[KVCacheGroupSpec, ...]
    alternatives: tuple[GroupingAlternative, ...]


def choose_kv_cache_groups(
    config: EngineConfig,
    kv_cache_spec: Mapping[str, KVCacheSpec],
    *,
    block_size_multiple: int = 1,
    allow_hybrid: bool = True,
    vllm_rule: bool = False,
) -> GroupingChoice:
    """The default builder's grouping with the alternatives it scored (``vllm_rule``:
    vLLM's fixed group-size rule whenever it applies, for comparisons)."""
    if config.max_model_len <= 0:
        config = config.replace(max_model_len=DEFAULT_REFERENCE_LEN)
    if not kv_cache_spec:
        return GroupingChoice((), ())
    specs: Mapping[str, KVCacheSpec] = kv_cache_spec
    if not allow_hybrid and single_group(specs) is None:
        specs = promote_local_specs(specs)
    single = single_group(specs)
    if single is not None:
        return GroupingChoice(tuple(single), (_single_alternative(single[0], config),))
    max_groups = config.cache.max_kv_cache_groups
    result = search(
        make_buckets(specs), config, block_size_multiple, vllm_rule=vllm_rule, max_groups=max_groups
    )
    groups = groups_from_buckets(result.chosen.page.buckets, result.chosen.group_size)
    alternatives = [_alternative(s, s is result.chosen, config, result) for s in _shortlist(result)]
    alternatives.sort(key=lambda a: (not a.chosen, a.bytes_per_request))
    return GroupingChoice(tuple(groups), tuple(alternatives))


def _single_alternative(group: KVCacheGroupSpec, config: EngineConfig) -> GroupingAlternative:
    spec = group.kv_cache_spec
    width = spec.page_size_bytes * (
        1 if isinstance(spec, UniformTypeKVCacheSpecs) else len(group.layer_names)
    )
    return GroupingAlternative(
        name="single group",
        chosen=True,
        block_sizes=(spec.block_size,),
        num_groups=1,
        layers_per_group=len(group.layer_names),
        bytes_per_block=width,
        waste_fraction=spec.padding_bytes / spec.page_size_bytes,
        bytes_per_request=spec.max_memory_usage_blocks(config) * width,
        reference_len=config.max_model_len,
        description="all layers share one block table (uniform or uniform-type specs)",
        max_groups=group_budget(config.cache.max_kv_cache_groups),
    )


def _describe(s: Scored) -> str:
    sizes = ", ".join(str(len(b)) for b in s.page.buckets)
    rule = "vLLM rule (smallest bucket unless largest < 1.5x)" if s.is_vllm else "searched"
    notes = [
        f"{-len(b) % s.group_size} padding layers for the {len(b)}-layer {b.first.kind} "
        f"bucket (may waste up to {-len(b) % s.group_size / len(b) * 100:.2f}%)"
        for b in s.page.buckets
        if len(b) % s.group_size
    ]
    return (
        f"{rule}: buckets of {sizes} layers split into groups of <= {s.group_size}, "
        f"{s.num_groups} groups, page {s.page.page_size_bytes} B ({s.page.name}); "
        + ("; ".join(notes) or "no padding layers")
    )


def _alternative(
    s: Scored, chosen: bool, config: EngineConfig, result: SearchResult
) -> GroupingAlternative:
    name = "vllm" if s.is_vllm else f"{s.page.name}, group size {s.group_size}"
    description = _describe(s)
    within = result.within_budget(s)
    if not within:
        name += f" (over the {result.max_groups}-group budget)"
        description += (
            f"; excluded: {s.num_groups} groups > max_kv_cache_groups {result.max_groups}"
        )
    return GroupingAlternative(
        name=name,
        chosen=chosen,
        block_sizes=s.block_sizes,
        num_groups=s.num_groups,
        layers_per_group=s.group_size,
        bytes_per_block=s.bytes_per_block,
        waste_fraction=s.waste_fraction,
        bytes_per_request=s.bytes_per_request,
        reference_len=config.max_model_len,
        description=description,
        max_groups=result.max_groups,
        within_budget=within,
    )


def _by_bytes(s: Scored) -> tuple[int, int]:
    return (s.bytes_per_request, s.num_groups)


def _shortlist(result: SearchResult) -> list[Scored]:
    """The chosen, vLLM's, the least-waste one the budget excluded, then the best of
    each page size within the budget and the chosen page's runners-up. Candidates
    with equal keys plan the same groups (vLLM's often equals a searched one)."""
    chosen = result.chosen
    within = sorted((s for s in result.scored if result.within_budget(s)), key=_by_bytes)
    over = [s for s in result.scored if not result.within_budget(s)]
    picked = [s for s in (chosen, result.vllm, min(over, key=_by_bytes, default=None)) if s]
    best_per_page: dict[str, Scored] = {}
    for s in within:
        if not s.is_vllm:
            best_per_page.setdefault(s.page.name, s)
    page = (chosen.page.page_size_bytes, chosen.block_sizes)
    same_page = [
        s for s in within if s is not chosen and (s.page.page_size_bytes, s.block_sizes) == page
    ]
    out: dict[tuple[Any, ...], Scored] = {}
    for s in [*picked, *best_per_page.values(), *same_page[:3]]:
        key = (s.page.page_size_bytes, s.group_size, s.block_sizes, s.bytes_per_request)
        out.setdefault(key, s)
    return list(out.values())[:MAX_ALTERNATIVES]
