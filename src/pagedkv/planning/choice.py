"""The default grouping: one group when the layers allow it, else the searched hybrid."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from pagedkv.config import EngineConfig
from pagedkv.planning.grouping import (
    groups_from_buckets,
    make_buckets,
    promote_local_specs,
    single_group,
)
from pagedkv.planning.placement import group_width_bytes
from pagedkv.planning.report import GroupingAlternative
from pagedkv.planning.search import Scored, SearchResult, group_budget, search
from pagedkv.planning.types import KVCacheGroupSpec
from pagedkv.specs.base import KVCacheSpec

# Length used to score groupings when max_model_len is -1 (the planner re-scores
# at the fitted length).
DEFAULT_REFERENCE_LEN = 32768
MAX_ALTERNATIVES = 8


@dataclass(frozen=True)
class GroupingChoice:
    groups: tuple[KVCacheGroupSpec, ...]
    alternatives: tuple[GroupingAlternative, ...]


def reference_config(config: EngineConfig) -> EngineConfig:
    if config.max_model_len > 0:
        return config
    return config.replace(max_model_len=DEFAULT_REFERENCE_LEN)


def _single_alternative(group: KVCacheGroupSpec, config: EngineConfig) -> GroupingAlternative:
    spec = group.kv_cache_spec
    bytes_per_block = group_width_bytes(group)
    return GroupingAlternative(
        name="single group",
        chosen=True,
        block_sizes=(spec.block_size,),
        num_groups=1,
        layers_per_group=len(group.layer_names),
        bytes_per_block=bytes_per_block,
        waste_fraction=spec.padding_bytes / spec.page_size_bytes,
        bytes_per_request=spec.max_memory_usage_blocks(config) * bytes_per_block,
        reference_len=config.max_model_len,
        description="all layers share one block table (uniform or uniform-type specs)",
        max_groups=group_budget(config.cache.max_kv_cache_groups),
        within_budget=True,
    )


def _padding_note(s: Scored) -> str:
    notes = []
    for bucket in s.page.buckets:
        pad = -len(bucket) % s.group_size
        if pad:
            notes.append(
                f"{pad} padding layers for the {len(bucket)}-layer {bucket.first.kind} bucket "
                f"(may waste up to {pad / len(bucket) * 100:.2f}%)"
            )
    return "; ".join(notes) if notes else "no padding layers"


def _describe(s: Scored) -> str:
    sizes = ", ".join(str(len(b)) for b in s.page.buckets)
    rule = "vLLM rule (smallest bucket unless largest < 1.5x)" if s.is_vllm else "searched"
    return (
        f"{rule}: buckets of {sizes} layers split into groups of <= {s.group_size}, "
        f"{s.num_groups} groups, page {s.page.page_size_bytes} B ({s.page.name}); "
        + _padding_note(s)
    )


def to_alternative(
    s: Scored, chosen: bool, config: EngineConfig, max_groups: int
) -> GroupingAlternative:
    within = s.num_groups <= max_groups
    name = "vllm" if s.is_vllm else f"{s.page.name}, group size {s.group_size}"
    description = _describe(s)
    if not within:
        name += f" (over the {max_groups}-group budget)"
        description += f"; excluded: {s.num_groups} groups > max_kv_cache_groups {max_groups}"
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
        max_groups=max_groups,
        within_budget=within,
    )


def _by_bytes(s: Scored) -> tuple[int, int]:
    return (s.bytes_per_request, s.num_groups)


def _shortlist(result: SearchResult) -> list[Scored]:
    """The chosen, vLLM's, the least-waste one the budget excluded, then the best of
    each page size within the budget and the chosen page's runners-up."""
    chosen, scored = result.chosen, result.scored
    picked: list[Scored] = [chosen]
    if result.vllm is not None:
        picked.append(result.vllm)
    over = [s for s in scored if not result.within_budget(s)]
    if over:
        picked.append(min(over, key=_by_bytes))
    best_per_page: dict[str, Scored] = {}
    for s in sorted(scored, key=_by_bytes):
        if not s.is_vllm and result.within_budget(s):
            best_per_page.setdefault(s.page.name, s)
    same_page = sorted(
        (
            s
            for s in scored
            if s is not chosen
            and result.within_budget(s)
            and s.page.page_size_bytes == chosen.page.page_size_bytes
            and s.block_sizes == chosen.block_sizes
        ),
        key=_by_bytes,
    )
    out: list[Scored] = []
    keys: set[tuple[int, int, tuple[int, ...], int]] = set()
    for s in [*picked, *best_per_page.values(), *same_page[:3]]:
        if _key(s) not in keys:
            keys.add(_key(s))
            out.append(s)
    return out[:MAX_ALTERNATIVES]


def _key(s: Scored) -> tuple[int, int, tuple[int, ...], int]:
    """Candidates with equal keys plan the same groups (vLLM's often equals a searched one)."""
    return (s.page.page_size_bytes, s.group_size, s.block_sizes, s.bytes_per_request)


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
    ref = reference_config(config)
    if not kv_cache_spec:
        return GroupingChoice((), ())
    specs: Mapping[str, KVCacheSpec] = kv_cache_spec
    if not allow_hybrid and single_group(specs) is None:
        specs = promote_local_specs(specs)
    single = single_group(specs)
    if single is not None:
        return GroupingChoice(tuple(single), (_single_alternative(single[0], ref),))
    result = search(
        make_buckets(specs),
        ref,
        block_size_multiple,
        vllm_rule=vllm_rule,
        max_groups=config.cache.max_kv_cache_groups,
    )
    groups = groups_from_buckets(result.chosen.page.buckets, result.chosen.group_size)
    alternatives = [
        to_alternative(s, s is result.chosen, ref, result.max_groups) for s in _shortlist(result)
    ]
    alternatives.sort(key=lambda a: (not a.chosen, a.bytes_per_request))
    return GroupingChoice(tuple(groups), tuple(alternatives))
