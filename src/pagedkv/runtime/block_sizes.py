"""The token granularities a model's KV cache manager works at, resolved as vLLM 0.33 does
from its groups' block sizes and ``CacheConfig.prefix_match_unit`` (docs/runtime.md)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

from pagedkv.errors import ConfigError
from pagedkv.planning.types import KVCacheGroupSpec
from pagedkv.runtime.coordinators import group_behaviour_spec, manager_class_for

__all__ = ["BlockSizes", "resolve_block_sizes"]


class BlockSizes(NamedTuple):
    """``scheduler_block_size``: chunks and cached prefixes of hybrid models are multiples
    of it (the lcm of the groups' block sizes). ``hash_block_size``: tokens per block hash.
    ``cache_hit_alignment_tokens``: hits end on multiples of it. ``partial_hash_hits``:
    hits may end inside a block (then the alignment is the hash block size)."""

    scheduler_block_size: int
    hash_block_size: int
    cache_hit_alignment_tokens: int
    partial_hash_hits: bool


def resolve_block_sizes(
    groups: Sequence[KVCacheGroupSpec],
    enable_caching: bool,
    prefix_match_unit: int | None,
    dcp_world_size: int = 1,
) -> BlockSizes:
    """vLLM's rule: one group hashes and hits per block; several hash every
    ``prefix_match_unit`` tokens (default: the gcd of the prefix-cacheable block sizes).
    Under decode context parallelism (``dcp_world_size`` > 1) a Mamba block equal to the
    hash block takes partial hits too (the attention blocks are the larger ones then).

    Args:
        groups: the model's KV cache groups.
        enable_caching: whether prefix caching is on; off, every size is the scheduler's.
        prefix_match_unit: tokens per block hash with several groups (None: the gcd of
            the prefix-cacheable groups' block sizes); with one group it must be None or
            that group's block size.
        dcp_world_size: decode context parallel ranks (1: none).

    Raises:
        ConfigError: ``prefix_match_unit`` does not divide every prefix-cacheable block
            size, or does not suit a single group or a compressed-state layer.
    """
    if not groups:
        return BlockSizes(1, 1, 1, False)
    specs = [group_behaviour_spec(g) for g in groups]
    block_sizes = [spec.block_size for spec in specs]
    unit_name = "CacheConfig.prefix_match_unit"
    if len(groups) == 1:
        block_size = block_sizes[0]
        if enable_caching and prefix_match_unit not in (None, block_size):
            raise ConfigError(
                f"{unit_name}={prefix_match_unit}: with one KV cache group hits land on its "
                f"block size ({block_size} tokens); unset it or set it to {block_size}"
            )
        return BlockSizes(block_size, block_size, block_size, False)
    scheduler = math.lcm(*block_sizes)
    if not enable_caching or any(_mamba_mode(spec) not in (None, "align") for spec in specs):
        return BlockSizes(scheduler, scheduler, scheduler, False)
    hashed = [s.block_size for s in specs if s.prefix_cacheable] or block_sizes
    unit = math.gcd(*hashed) if prefix_match_unit is None else prefix_match_unit
    if any(size % unit for size in hashed):
        raise ConfigError(
            f"{unit_name}={unit}: every prefix-cacheable KV cache group's block size must be "
            f"a multiple of it (block sizes {block_sizes})"
        )
    partial = _partial_hits(groups, unit, dcp_world_size > 1)
    alignment = unit if partial else scheduler
    _check_state_compression(groups, alignment, unit_name, unit)
    return BlockSizes(scheduler, unit, alignment, partial)


def _check_state_compression(
    groups: Sequence[KVCacheGroupSpec], alignment: int, unit_name: str, unit: int
) -> None:
    """Hits must end on a whole compressed state of every prefix-cacheable layer that
    packs several tokens per state (vLLM's ``tokens_per_state``)."""
    per_state = {
        tokens
        for group in groups
        for spec in group.layer_specs().values()
        if spec.prefix_cacheable
        and type(tokens := getattr(spec, "tokens_per_state", 1)) is int
        and tokens > 1
    }
    if any(alignment % tokens for tokens in per_state):
        raise ConfigError(
            f"{unit_name}={unit}: prefix-cache hits land every {alignment} tokens, which "
            f"must align with each layer's per-state compression (tokens per state "
            f"{sorted(per_state)})"
        )


def _mamba_mode(spec: object) -> str | None:
    return getattr(spec, "mamba_cache_mode", None) if getattr(spec, "kind", "") == "mamba" else None


def _partial_hits(groups: Sequence[KVCacheGroupSpec], hash_block_size: int, dcp: bool) -> bool:
    # A Mamba "align" group whose block is larger than the hash block (under DCP: at least
    # as large), and every other prefix-cacheable group either hitting at hash granularity
    # or hashed per block.
    specs = [group_behaviour_spec(g) for g in groups]
    smallest = hash_block_size if dcp else hash_block_size + 1
    if not any(_mamba_mode(s) == "align" and s.block_size >= smallest for s in specs):
        return False
    for gid, (group, spec) in enumerate(zip(groups, specs)):
        if not spec.prefix_cacheable or spec.block_size == hash_block_size:
            continue
        if not manager_class_for(group, gid).supports_fine_grained_hits:
            return False
    return True
