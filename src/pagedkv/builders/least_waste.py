"""The ``least-waste`` grouping rule (``CacheConfig.kv_cache_grouping_rule="least-waste"``,
``pagedkv plan --grouping least-waste``): pagedkv's opt-in that searches page sizes
and group sizes (``search``) for the grouping holding the fewest bytes per request
within the group budget, and reports the alternatives it scored. See docs/planning.md."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pagedkv.builders.search import Scored, SearchResult, group_budget, search
from pagedkv.capacity.report import GroupingAlternative
from pagedkv.config import EngineConfig
from pagedkv.planning.builder import DefaultKVCacheConfigBuilder
from pagedkv.planning.grouping import (
    GroupingChoice,
    groups_from_buckets,
    make_buckets,
    single_group,
)
from pagedkv.planning.placement import group_width_bytes
from pagedkv.planning.types import KVCacheGroupSpec
from pagedkv.specs.base import KVCacheSpec

__all__ = [
    "DEFAULT_REFERENCE_LEN",
    "MAX_ALTERNATIVES",
    "LeastWasteKVCacheConfigBuilder",
    "least_waste_grouping",
]

# Length used to score groupings when max_model_len is -1 (the planner re-scores
# at the fitted length).
DEFAULT_REFERENCE_LEN = 32768
MAX_ALTERNATIVES = 8


class LeastWasteKVCacheConfigBuilder(DefaultKVCacheConfigBuilder):
    """The default builder held to the least-waste grouping (for a platform or model
    that names a builder rather than a grouping rule)."""

    grouping_rule = "least-waste"


def least_waste_grouping(
    config: EngineConfig, kv_cache_spec: Mapping[str, KVCacheSpec], block_size_multiple: int
) -> GroupingChoice:
    """One group when the layers allow it, else the searched grouping; with the
    alternatives scored at ``max_model_len`` (``DEFAULT_REFERENCE_LEN`` when -1)."""
    if config.max_model_len <= 0:
        config = config.replace(max_model_len=DEFAULT_REFERENCE_LEN)
    single = single_group(kv_cache_spec)
    if single is not None:
        return GroupingChoice(tuple(single), (_single_alternative(single[0], config),))
    max_groups = config.cache.max_kv_cache_groups
    result = search(make_buckets(kv_cache_spec), config, block_size_multiple, max_groups=max_groups)
    groups = groups_from_buckets(result.chosen.page.buckets, result.chosen.group_size)
    alternatives = [_alternative(s, s is result.chosen, config, result) for s in _shortlist(result)]
    alternatives.sort(key=lambda a: (not a.chosen, a.bytes_per_request))
    return GroupingChoice(tuple(groups), tuple(alternatives))


def _single_alternative(group: KVCacheGroupSpec, config: EngineConfig) -> GroupingAlternative:
    spec = group.kv_cache_spec
    width = group_width_bytes(group)
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
