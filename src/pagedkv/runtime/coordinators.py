"""Coordinators: build the shared pool and one manager per group, and combine the groups'
cache-hit searches into one hit length valid for every group."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from pagedkv.errors import ConfigError, RegistryError
from pagedkv.planning.types import KVCacheConfig, KVCacheGroupSpec
from pagedkv.registry import KVCacheSpecRegistry
from pagedkv.runtime.block_pool import BlockPool
from pagedkv.runtime.free_queue import FreeQueue
from pagedkv.runtime.managers.base import HitQuery, SingleTypeKVCacheManager
from pagedkv.specs.base import KVCacheSpec, cdiv
from pagedkv.specs.uniform import UniformTypeKVCacheSpecs


def group_behaviour_spec(group: KVCacheGroupSpec) -> KVCacheSpec:
    """The spec that decides a group's lifetime: a uniform-type group's first layer spec."""
    spec = group.kv_cache_spec
    if isinstance(spec, UniformTypeKVCacheSpecs):
        return spec.first_spec
    return spec


def resolve_caching(
    groups: Sequence[KVCacheGroupSpec], default: bool, enable_caching: bool | None
) -> bool:
    """``enable_caching``, or when None ``default`` unless a group's kind turns caching
    off (``KVCacheSpec.disables_prefix_caching``); groups that are merely never cached (a
    ring) stay out of the cache while the others cache."""
    specs = [group_behaviour_spec(g) for g in groups]
    if not specs:
        return False
    if enable_caching is None:
        return default and not any(s.disables_prefix_caching for s in specs)
    for gid, spec in enumerate(specs):
        if enable_caching and spec.disables_prefix_caching:
            raise ConfigError(
                f"enable_caching=True but KV cache group {gid} ({type(spec).__name__}, "
                f"kind {spec.kind!r}) cannot be prefix-cached"
            )
    return enable_caching


def manager_class_for(group: KVCacheGroupSpec, group_id: int) -> type[SingleTypeKVCacheManager]:
    spec = group_behaviour_spec(group)
    manager_cls = KVCacheSpecRegistry.get_manager_class(spec, role=group.role)
    if manager_cls is None:
        raise RegistryError(
            f"KV cache group {group_id} (layers {', '.join(group.layer_names[:3])}...): "
            f"no manager registered for spec type {type(spec).__name__}"
        )
    if not issubclass(manager_cls, SingleTypeKVCacheManager):
        raise RegistryError(
            f"KV cache group {group_id}: manager {manager_cls.__qualname__} does not "
            "subclass SingleTypeKVCacheManager"
        )
    return manager_cls


class SpecGroup(NamedTuple):
    """Groups with equal spec and manager class, looked up together (all must hit)."""

    spec: KVCacheSpec
    group_ids: tuple[int, ...]
    manager_cls: type[SingleTypeKVCacheManager]


class KVCacheCoordinator:
    """Owns the block pool and one manager per group, and combines the groups' cache-hit
    searches (vLLM's fixed point): downward-closed kinds first, once; the others repeat
    within the current bound until no kind shortens the hit."""

    def __init__(
        self,
        kv_cache_config: KVCacheConfig,
        *,
        enable_events: bool = False,
        free_queue: FreeQueue | None = None,
        **manager_kwargs: Any,
    ) -> None:
        self.enable_caching = manager_kwargs["enable_caching"]
        self.hash_block_size = manager_kwargs["hash_block_size"]
        self.alignment_tokens = alignment_tokens = manager_kwargs["alignment_tokens"]
        pool = BlockPool(
            kv_cache_config.num_blocks,
            self.enable_caching,
            self.hash_block_size,
            enable_events,
            free_queue=free_queue,
        )
        self.block_pool = pool
        self.managers: list[SingleTypeKVCacheManager] = [
            manager_class_for(group, gid)(
                group_behaviour_spec(group), pool, kv_cache_group_id=gid, **manager_kwargs
            )
            for gid, group in enumerate(kv_cache_config.kv_cache_groups)
        ]
        by_key: dict[tuple[Any, type], list[int]] = {}
        for gid, manager in enumerate(self.managers):
            if manager.enable_caching:
                by_key.setdefault((manager.kv_cache_spec, type(manager)), []).append(gid)
        groups = [SpecGroup(spec, tuple(ids), cls) for (spec, cls), ids in by_key.items()]
        self.spec_groups = sorted(groups, key=lambda g: not g.manager_cls.downward_closed_hits)
        self._searches = [
            (sg.manager_cls, sg.group_ids, (pool, sg.spec, alignment_tokens, self.hash_block_size))
            for sg in self.spec_groups
        ]
        self._one_pass = len(groups) == 2 and self.spec_groups[0].manager_cls.downward_closed_hits

    def find_longest_cache_hit(
        self, block_hashes: list[Any], max_length: int
    ) -> tuple[list[list[int]], int, int]:
        """Hit blocks per group, the hit length and the longest prefix some group had."""
        lists: list[list[int]] = [[] for _ in self.managers]
        if len(self._searches) == 1:  # one kind: its search is the answer
            cls, group_ids, where = self._searches[0]
            found, hit = cls.find_longest_cache_hit(
                HitQuery(block_hashes, max_length, group_ids, *where)
            )
            for gid, blocks in zip(group_ids, found):
                lists[gid] = blocks
            return lists, hit, hit
        if not self._searches:
            return lists, 0, 0
        candidate = max_length
        longest = 0
        searched_once: dict[int, int] = {}
        while True:
            current = candidate
            for index, (cls, group_ids, where) in enumerate(self._searches):
                if index in searched_once:
                    current = min(current, searched_once[index])
                    continue
                found, hit = cls.find_longest_cache_hit(
                    HitQuery(block_hashes, current, group_ids, *where)
                )
                for gid, blocks in zip(group_ids, found):
                    lists[gid] = blocks
                if cls.downward_closed_hits:
                    searched_once[index] = hit
                current = hit
                if hit > longest:
                    longest = hit
            if current >= candidate:
                break
            candidate = current
            if self._one_pass:
                break
        for index in searched_once:
            sg = self.spec_groups[index]
            keep = cdiv(candidate, sg.spec.block_size)
            for gid in sg.group_ids:
                del lists[gid][keep:]
        return lists, candidate, longest


class NoPrefixCacheCoordinator(KVCacheCoordinator):
    """Prefix caching off: never a hit. Any number of groups, including none."""


class UnitaryCoordinator(KVCacheCoordinator):
    """One group: its manager's search is the answer."""


class HybridCoordinator(KVCacheCoordinator):
    """Several kinds, combined by the fixed point."""


def make_coordinator(kv_cache_config: KVCacheConfig, **kwargs: Any) -> KVCacheCoordinator:
    """No prefix cache when caching is off, unitary for one group, hybrid otherwise."""
    if not kwargs["enable_caching"]:
        return NoPrefixCacheCoordinator(kv_cache_config, **kwargs)
    if len(kv_cache_config.kv_cache_groups) == 1:
        return UnitaryCoordinator(kv_cache_config, **kwargs)
    return HybridCoordinator(kv_cache_config, **kwargs)
