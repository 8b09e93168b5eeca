"""Layers into KV cache groups: buckets of mergeable specs, one group when the layers
allow it, else vLLM's hybrid rule (one page size, groups of the smallest bucket; with a
block-outermost layout, vLLM's packing of mixed page sizes instead); the
rule a config names (``CacheConfig.kv_cache_grouping_rule``); and the exact-partition
check the planner runs on any builder's groups."""

from __future__ import annotations

import dataclasses
import logging
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from pagedkv.config import KV_CACHE_GROUPING_RULES, EngineConfig
from pagedkv.errors import ConfigError, KVCacheSpecError, PlanningError
from pagedkv.planning.hidden import add_hidden_groups, split_hidden
from pagedkv.planning.layout import is_block_outermost, resolve_kv_cache_layout
from pagedkv.planning.packing import packed_kv_cache_groups
from pagedkv.planning.pages import (
    Bucket,
    fit_page,
    is_state_spec,
    unify_pages,
    vllm_page,
)
from pagedkv.planning.types import KVCacheGroupSpec
from pagedkv.platforms import resolve_obj_by_qualname
from pagedkv.specs.base import KVCacheSpec, cdiv
from pagedkv.specs.full import FullAttentionSpec, MLAAttentionSpec
from pagedkv.specs.local import ChunkedLocalAttentionSpec, SlidingWindowMLASpec, SlidingWindowSpec
from pagedkv.specs.uniform import UniformTypeKVCacheSpecs

__all__ = [
    "merge_specs",
    "try_merge",
    "make_buckets",
    "groups_from_buckets",
    "single_group",
    "promote_to_full",
    "promote_local_specs",
    "with_retained_tokens",
    "mark_eagle_groups",
    "check_exact_partition",
    "vllm_group_size",
    "GroupingChoice",
    "GroupingRule",
    "vllm_grouping",
    "choose_kv_cache_groups",
    "grouping_rule",
]

logger = logging.getLogger(__name__)


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


# Local kinds and the full-attention kind each is promoted to (subclasses first).
_PROMOTED = (
    (SlidingWindowMLASpec, MLAAttentionSpec),
    (SlidingWindowSpec, FullAttentionSpec),
    (ChunkedLocalAttentionSpec, FullAttentionSpec),
)


def _family_class(target: type[KVCacheSpec], local: type[KVCacheSpec]) -> type[KVCacheSpec]:
    """``target`` as spelled in ``local``'s family: the direct subclass of ``target`` of
    the same name defined beside ``local`` (an integration's spec classes, such as
    ``pagedkv.compat.vllm``'s), else ``target`` itself."""
    for sub in target.__subclasses__():
        if sub.__module__ == local.__module__ and sub.__name__ == target.__name__:
            return sub
    return target


def promote_to_full(spec: KVCacheSpec, block_size: int | None) -> KVCacheSpec:
    """A sliding-window or chunked layer as full attention (window kept as metadata;
    retained lookahead tokens dropped, as a full layer frees nothing). vLLM's rule at a
    new block size: a padded page keeps its padding unless the real page outgrows it."""
    core = next((full for local, full in _PROMOTED if isinstance(spec, local)), None)
    if core is None:
        return spec
    target = _family_class(core, type(spec))
    names = [
        f.name
        for f in dataclasses.fields(target)
        if f.init and hasattr(spec, f.name) and f.name != "extra_retained_tokens"
    ]
    promoted = target(**{name: getattr(spec, name) for name in names})
    if block_size is None or block_size == promoted.block_size:
        return promoted
    padded = getattr(spec, "page_size_padded", None)
    resized = dataclasses.replace(promoted, block_size=block_size, page_size_padded=None)  # type: ignore[call-arg]
    if padded is not None:
        padded = max(padded, resized.real_page_size_bytes)
        resized = dataclasses.replace(resized, page_size_padded=padded)  # type: ignore[call-arg]
    return resized


def promote_local_specs(kv_cache_spec: Mapping[str, KVCacheSpec]) -> dict[str, KVCacheSpec]:
    """Hybrid groups disabled: local layers as full attention so one group fits
    (PlanningError naming the layers that still cannot share one)."""
    specs = kv_cache_spec.values()
    full_sizes = {
        s.block_size for s in specs if isinstance(s, FullAttentionSpec) and not s.is_draft
    }
    block_size = next(iter(full_sizes)) if len(full_sizes) == 1 else None
    # vLLM promotes only beside full attention: local layers alone keep their kinds.
    has_full = any(isinstance(s, FullAttentionSpec) for s in specs)
    promoted = {
        name: promote_to_full(s, block_size) if has_full else s for name, s in kv_cache_spec.items()
    }
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
    kv_cache_spec: Mapping[str, KVCacheSpec], prefill_lookahead_tokens: int
) -> dict[str, KVCacheSpec]:
    """Sliding-window layers keep ``prefill_lookahead_tokens - 1`` extra tokens (vLLM's
    ``num_prefill_lookahead_tokens``: the prompt tokens a drafter reads past a chunk)."""
    extra = max(0, prefill_lookahead_tokens - 1)
    return {
        name: dataclasses.replace(spec, extra_retained_tokens=extra)
        if isinstance(spec, SlidingWindowSpec) and spec.extra_retained_tokens != extra
        else spec
        for name, spec in kv_cache_spec.items()
    }


def mark_eagle_groups(
    groups: Sequence[KVCacheGroupSpec], kv_cache_spec: Mapping[str, KVCacheSpec]
) -> tuple[KVCacheGroupSpec, ...]:
    """The groups with ``is_eagle_group`` set on those holding a draft layer (the groups
    an EAGLE/MTP drafter reads; vLLM marks them when it drops the trailing block)."""
    return tuple(
        dataclasses.replace(
            group, is_eagle_group=any(kv_cache_spec[n].is_draft for n in group.layer_names)
        )
        for group in groups
    )


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


def vllm_group_size(bucket_sizes: Sequence[int]) -> int:
    """vLLM's rule: the smallest bucket, unless the largest is under 1.5x of it."""
    smallest, largest = min(bucket_sizes), max(bucket_sizes)
    return largest if largest < 1.5 * smallest else smallest


class GroupingChoice(NamedTuple):
    groups: tuple[KVCacheGroupSpec, ...]
    alternatives: tuple[Any, ...] = ()  # pagedkv.capacity.GroupingAlternative, if scored


# (config, the layers' specs, the platform's block size multiple) -> the groups.
GroupingRule = Callable[[EngineConfig, Mapping[str, KVCacheSpec], int], GroupingChoice]


def vllm_grouping(
    config: EngineConfig, kv_cache_spec: Mapping[str, KVCacheSpec], block_size_multiple: int
) -> GroupingChoice:
    """vLLM 0.33's grouping: one group when the layers allow it; else every page
    unified to vLLM's page size and each bucket split into groups of
    ``vllm_group_size``; layers whose pages cannot be unified take vLLM's fallback."""
    single = single_group(kv_cache_spec)
    if single is not None:
        return GroupingChoice(tuple(single))
    specs, hidden = split_hidden(kv_cache_spec)
    block_outer = is_block_outermost(resolve_kv_cache_layout(config))
    if block_outer and len({s.page_size_bytes for s in specs.values()}) > 1:
        packed = packed_kv_cache_groups(specs)
        return GroupingChoice((*packed, *_own_groups(hidden)))
    buckets = make_buckets(specs)
    page, attention_bs = vllm_page(buckets, config.block_size, block_size_multiple)
    unified = unify_pages(buckets, page, attention_bs)
    if unified is None:
        return GroupingChoice(tuple(_full_allocation_fallback(specs, page, not hidden)))
    groups = groups_from_buckets(unified, vllm_group_size(list(map(len, buckets))))
    return GroupingChoice(tuple(add_hidden_groups(groups, hidden)))


def _own_groups(specs: Mapping[str, KVCacheSpec]) -> list[KVCacheGroupSpec]:
    return [KVCacheGroupSpec(layer_names=(name,), kv_cache_spec=s) for name, s in specs.items()]


def _full_allocation_fallback(
    kv_cache_spec: Mapping[str, KVCacheSpec], page_bytes: int, allowed: bool = True
) -> list[KVCacheGroupSpec]:
    """vLLM's way out when pages cannot be unified: with MLA and plain sliding-window
    layers (no sliding MLA or chunked ones, no hidden-state layers: not ``allowed``) the
    windows become full attention in one uniform-type group; otherwise a PlanningError
    naming the layer that does not fit."""
    specs = kv_cache_spec.values()
    mla = allowed and any(isinstance(s, MLAAttentionSpec) for s in specs)
    local = any(isinstance(s, SlidingWindowMLASpec | ChunkedLocalAttentionSpec) for s in specs)
    if mla and not local and any(isinstance(s, SlidingWindowSpec) for s in specs):
        # Windows take the block size full-attention layers (MLA included) agree on.
        sizes = {s.block_size for s in specs if isinstance(s, FullAttentionSpec)}
        block_size = sizes.pop() if len(sizes) == 1 else None
        single = single_group({n: promote_to_full(s, block_size) for n, s in kv_cache_spec.items()})
        if single is not None:
            logger.warning(
                "KV cache page sizes cannot be unified; sliding-window layers are allocated "
                "as full attention in one group. Sliding-window attention compute is unchanged."
            )
            return single
    unfit = (
        n
        for n, s in kv_cache_spec.items()
        if not is_state_spec(s) and not fit_page(s, page_bytes, 0)
    )
    name = next(unfit, next(iter(kv_cache_spec)))
    raise PlanningError(
        f"layer {name!r}: its page ({kv_cache_spec[name].page_size_bytes} B) does not divide "
        f"the largest page ({page_bytes} B) and cannot be padded (MLA pages never are), so "
        "vLLM's grouping cannot unify the page sizes; kv_cache_grouping_rule='least-waste' "
        "searches other page sizes"
    )


def choose_kv_cache_groups(
    config: EngineConfig,
    kv_cache_spec: Mapping[str, KVCacheSpec],
    *,
    block_size_multiple: int = 1,
    allow_hybrid: bool = True,
    rule: str | None = None,
) -> GroupingChoice:
    """The groups (and any alternatives scored) of the grouping rule named ``rule``
    (None: ``config.cache.kv_cache_grouping_rule``), after promoting local layers to
    full attention when hybrid groups are disallowed.

    Args:
        config: the engine config the rule reads.
        kv_cache_spec: layer name -> KV cache spec, merged over workers.
        block_size_multiple: the platform's block-size multiple, in tokens.
        allow_hybrid: whether groups of different kinds may coexist; False promotes local layers to
            full attention.
        rule: name of a registered grouping rule (None: ``config.cache.kv_cache_grouping_rule``).
    """
    if not kv_cache_spec:
        return GroupingChoice(())
    specs: Mapping[str, KVCacheSpec] = kv_cache_spec
    if not allow_hybrid and single_group(specs) is None:
        specs = promote_local_specs(specs)
    return grouping_rule(rule or config.cache.kv_cache_grouping_rule)(
        config, specs, block_size_multiple
    )


def grouping_rule(name: str) -> GroupingRule:
    """The grouping rule registered as ``name`` in ``config.KV_CACHE_GROUPING_RULES``."""
    if name not in KV_CACHE_GROUPING_RULES:
        known = ", ".join(map(repr, KV_CACHE_GROUPING_RULES))
        raise ConfigError(f"unknown KV cache grouping rule {name!r}; known: {known}")
    rule: GroupingRule = resolve_obj_by_qualname(KV_CACHE_GROUPING_RULES[name])
    return rule
