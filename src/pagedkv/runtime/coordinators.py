"""Coordinators: build the shared pool and one manager per group, and combine the groups'
cache-hit searches into one hit length valid for every group."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pagedkv.errors import RegistryError
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


@dataclass(frozen=True)
class SpecGroup:
    """Groups with equal spec and manager class, looked up together (all must hit)."""

    spec: KVCacheSpec
    group_ids: tuple[int, ...]
    manager_cls: type[SingleTypeKVCacheManager]


class KVCacheCoordinator:
    """Owns the block pool and one manager per group, and combines the groups' cache-hit
    searches (vLLM's fixed point): downward-closed kinds (full attention) are searched
    once, first; each other kind is searched within the current bound; the passes repeat
    until no kind shortens the hit (one pass with one downward-closed kind plus one other,
    or a single kind). Every kind rounds down to ``alignment_tokens``."""

    def __init__(
        self,
        kv_cache_config: KVCacheConfig,
        *,
        max_model_len: int,
        enable_caching: bool,
        hash_block_size: int,
        alignment_tokens: int,
        enable_events: bool = False,
        in_flight_tokens: int | None = None,
        retention: str = "vllm",
        free_queue: FreeQueue | None = None,
    ) -> None:
        self.enable_caching = enable_caching
        self.hash_block_size = hash_block_size
        self.alignment_tokens = alignment_tokens
        self.block_pool = BlockPool(
            kv_cache_config.num_blocks,
            enable_caching,
            hash_block_size,
            enable_events,
            free_queue=free_queue,
        )
        self.managers: list[SingleTypeKVCacheManager] = [
            manager_class_for(group, gid)(
                group_behaviour_spec(group),
                self.block_pool,
                kv_cache_group_id=gid,
                enable_caching=enable_caching,
                hash_block_size=hash_block_size,
                alignment_tokens=alignment_tokens,
                max_model_len=max_model_len,
                in_flight_tokens=in_flight_tokens,
                retention=retention,
            )
            for gid, group in enumerate(kv_cache_config.kv_cache_groups)
        ]
        by_key: dict[tuple[Any, type], list[int]] = {}
        for gid, manager in enumerate(self.managers):
            if manager.enable_caching:
                by_key.setdefault((manager.kv_cache_spec, type(manager)), []).append(gid)
        groups = [SpecGroup(spec, tuple(ids), cls) for (spec, cls), ids in by_key.items()]
        # Stable sort: downward-closed kinds first, otherwise in group order.
        self.spec_groups = sorted(groups, key=lambda g: not g.manager_cls.downward_closed_hits)
        self._one_pass = (
            len(self.spec_groups) == 2 and self.spec_groups[0].manager_cls.downward_closed_hits
        )

    def find_longest_cache_hit(
        self, block_hashes: list[Any], max_length: int
    ) -> tuple[list[list[int]], int, int]:
        """Hit blocks per group, the hit length in tokens (valid for every group) and the
        longest prefix some group had cached (> hit when another group cut it short)."""
        lists: list[list[int]] = [[] for _ in self.managers]
        if len(self.spec_groups) <= 1:  # no caching, or one kind: its search is the answer
            if not self.spec_groups:
                return lists, 0, 0
            sg = self.spec_groups[0]
            found, hit = sg.manager_cls.find_longest_cache_hit(
                HitQuery(
                    block_hashes,
                    max_length,
                    sg.group_ids,
                    self.block_pool,
                    sg.spec,
                    self.alignment_tokens,
                    self.hash_block_size,
                )
            )
            for gid, blocks in zip(sg.group_ids, found):
                lists[gid] = blocks
            return lists, hit, hit
        candidate = max_length
        longest = 0
        searched_once: dict[int, int] = {}
        pool, align, hash_bs = self.block_pool, self.alignment_tokens, self.hash_block_size
        while True:
            current = candidate
            for index, sg in enumerate(self.spec_groups):
                if index in searched_once:
                    current = min(current, searched_once[index])
                    continue
                found, hit = sg.manager_cls.find_longest_cache_hit(
                    HitQuery(block_hashes, current, sg.group_ids, pool, sg.spec, align, hash_bs)
                )
                for gid, blocks in zip(sg.group_ids, found):
                    lists[gid] = blocks
                if sg.manager_cls.downward_closed_hits:
                    searched_once[index] = hit
                current = hit
                longest = max(longest, hit)
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
