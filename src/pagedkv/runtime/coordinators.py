"""Coordinators: build the shared pool and one manager per group, and combine the groups'
cache-hit searches into one hit length valid for every group."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar, NamedTuple

from pagedkv.errors import ConfigError, KVCacheRuntimeError, RegistryError
from pagedkv.planning.types import KVCacheConfig, KVCacheGroupSpec
from pagedkv.registry import KVCacheSpecRegistry
from pagedkv.runtime.block_pool import BlockPool
from pagedkv.runtime.free_queue import FreeQueue
from pagedkv.runtime.managers.base import HitQuery, SingleTypeKVCacheManager
from pagedkv.specs.base import KVCacheSpec, cdiv
from pagedkv.specs.uniform import UniformTypeKVCacheSpecs

__all__ = [
    "group_behaviour_spec",
    "resolve_caching",
    "manager_class_for",
    "eagle_groups",
    "SpecGroup",
    "KVCacheCoordinator",
    "NoPrefixCacheCoordinator",
    "UnitaryCoordinator",
    "HybridCoordinator",
    "make_coordinator",
]


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


def eagle_groups(
    groups: Sequence[KVCacheGroupSpec], use_eagle: bool
) -> tuple[frozenset[int], frozenset[int]]:
    """The EAGLE groups (those holding draft layers, or every group when ``use_eagle`` and
    none is marked) and those of them whose hits drop the EAGLE block (none unless
    ``use_eagle``: lookahead block hashes make the drop unnecessary)."""
    marked = frozenset(gid for gid, group in enumerate(groups) if group.is_eagle_group)
    if use_eagle and not marked:
        marked = frozenset(range(len(groups)))
    return marked, (marked if use_eagle else frozenset())


class SpecGroup(NamedTuple):
    """Groups with equal spec and manager class, looked up together (all must hit);
    ``use_eagle``: one of them drops the EAGLE block, so the lookup does for all."""

    spec: KVCacheSpec
    group_ids: tuple[int, ...]
    manager_cls: type[SingleTypeKVCacheManager]
    use_eagle: bool = False


class KVCacheCoordinator:
    """Owns the block pool and one manager per group, and combines the groups' cache-hit
    searches (vLLM's fixed point): downward-closed kinds first, once; the others repeat
    within the current bound until no kind shortens the hit."""

    eagle_margin: ClassVar[bool] = True  # an EAGLE lookup looks one block past the bound

    def __init__(
        self,
        kv_cache_config: KVCacheConfig,
        *,
        enable_events: bool = False,
        free_queue: FreeQueue | None = None,
        use_eagle: bool = False,
        num_prefill_lookahead: int = 0,
        scheduler_block_size: int | None = None,
        **manager_kwargs: Any,
    ) -> None:
        self.enable_caching = manager_kwargs["enable_caching"]
        self.hash_block_size = manager_kwargs["hash_block_size"]
        self.alignment_tokens = alignment_tokens = manager_kwargs["alignment_tokens"]
        self.scheduler_block_size = scheduler_block_size or alignment_tokens
        groups_config = kv_cache_config.kv_cache_groups
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
            for gid, group in enumerate(groups_config)
        ]
        self.eagle_group_ids, self.drop_eagle_group_ids = eagle_groups(groups_config, use_eagle)
        # Multi-module MTP re-prefills the last ``lookahead - 1`` tokens: not yet final.
        self.num_reprefillable_tokens = max(0, num_prefill_lookahead - 1)
        self._check_eagle(num_prefill_lookahead)
        by_key: dict[tuple[Any, type], list[int]] = {}
        for gid, manager in enumerate(self.managers):
            if manager.enable_caching:
                by_key.setdefault((manager.kv_cache_spec, type(manager)), []).append(gid)
        drops = self.drop_eagle_group_ids
        groups = [
            SpecGroup(spec, tuple(ids), cls, not drops.isdisjoint(ids))
            for (spec, cls), ids in by_key.items()
        ]
        self.spec_groups = sorted(groups, key=lambda g: not g.manager_cls.downward_closed_hits)
        for sg in self.spec_groups:
            for gid in sg.group_ids:
                self.managers[gid].use_eagle = sg.use_eagle
        for manager in self.managers:
            manager.eagle_replay = bool(drops)
            manager.scheduler_block_size = self.scheduler_block_size
        self._searches = [
            (sg.manager_cls, sg.group_ids, (pool, sg.spec, alignment_tokens, self.hash_block_size))
            for sg in self.spec_groups
        ]
        self._one_pass = len(groups) == 2 and self.spec_groups[0].manager_cls.downward_closed_hits

    def use_pool(self, group_id: int, pool: BlockPool) -> None:
        """Move group ``group_id``, holding no request yet, to a pool of its own (HiSparse's
        host group): it allocates, caches and is looked up there."""
        manager = self.managers[group_id]
        if manager.req_to_blocks:
            raise KVCacheRuntimeError(
                f"KV cache group {group_id} holds requests; move it to a pool before any"
            )
        manager.block_pool = pool
        manager.retention.block_pool = pool
        self._searches = [
            (cls, ids, (self.managers[ids[0]].block_pool, *where[1:]))
            for cls, ids, where in self._searches
        ]

    def _check_eagle(self, num_prefill_lookahead: int) -> None:
        for gid in sorted(self.drop_eagle_group_ids):
            manager = self.managers[gid]
            if manager.enable_caching and not manager.supports_eagle_block_drop:
                raise ConfigError(
                    f"KV cache group {gid} ({type(manager.kv_cache_spec).__name__}): the "
                    "EAGLE block drop (use_eagle=True) is not supported for this kind"
                )
        eagle_caching = self.enable_caching and self.eagle_group_ids
        if eagle_caching and self.scheduler_block_size < num_prefill_lookahead:
            raise ConfigError(
                f"num_prefill_lookahead={num_prefill_lookahead} (multi-module MTP) with "
                f"prefix caching needs a scheduler block size of at least that many "
                f"tokens, got {self.scheduler_block_size}"
            )

    def find_longest_cache_hit(
        self, block_hashes: list[Any], max_length: int
    ) -> tuple[list[list[int]], int, int]:
        """Hit blocks per group, the hit length and the longest prefix some group had."""
        if self.drop_eagle_group_ids:
            return self._find_with_eagle_drop(block_hashes, max_length)
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

    def _eagle_margin(self, sg: SpecGroup) -> int:
        # What an EAGLE lookup drops: a hash block where hits end inside blocks, else a block.
        block_size = sg.spec.block_size
        if sg.manager_cls.supports_fine_grained_hits and self.alignment_tokens < block_size:
            return int(self.hash_block_size)
        return block_size

    def _find_with_eagle_drop(
        self, block_hashes: list[Any], max_length: int
    ) -> tuple[list[list[int]], int, int]:
        # The fixed point above, where an EAGLE spec group looks one block past the bound
        # (several groups only) and drops the block its hit ends on, once per bound.
        lists: list[list[int] | None] = [None] * len(self.managers)
        lengths = [0] * len(self.managers)
        num_hashed = len(block_hashes) * self.hash_block_size
        candidate = max_length
        longest = 0
        verified: set[int] = set()  # EAGLE spec groups whose drop holds at this bound
        while True:
            current = candidate
            for index, sg in enumerate(self.spec_groups):
                cls, first = sg.manager_cls, sg.group_ids[0]
                if cls.downward_closed_hits and lists[first] is not None:
                    current = min(current, lengths[first])
                    continue
                drop = sg.use_eagle and index not in verified
                bound = current
                if drop and cls.looks_past_eagle_block and self.eagle_margin:
                    bound = min(current + self._eagle_margin(sg), num_hashed)
                _, group_ids, where = self._searches[index]
                found, hit = cls.find_longest_cache_hit(
                    HitQuery(block_hashes, bound, group_ids, *where, drop_eagle_block=drop)
                )
                if drop:
                    verified.add(index)
                elif hit < current:
                    verified.clear()
                current = hit
                for gid, blocks in zip(group_ids, found):
                    lists[gid] = blocks
                    lengths[gid] = hit
                longest = max(longest, hit)
            if current >= candidate:
                break
            candidate = current
            if self._one_pass:
                break
        found_lists = [blocks or [] for blocks in lists]
        for sg in self.spec_groups:
            if sg.manager_cls.downward_closed_hits:
                keep = cdiv(candidate, sg.spec.block_size)
                for gid in sg.group_ids:
                    del found_lists[gid][keep:]
        return found_lists, candidate, longest


class NoPrefixCacheCoordinator(KVCacheCoordinator):
    """Prefix caching off: never a hit. Any number of groups, including none."""


class UnitaryCoordinator(KVCacheCoordinator):
    """One group: its manager's search is the answer (under EAGLE it drops its last block
    without looking past the bound first, as vLLM's unitary coordinator does)."""

    eagle_margin = False


class HybridCoordinator(KVCacheCoordinator):
    """Several kinds, combined by the fixed point."""


def make_coordinator(kv_cache_config: KVCacheConfig, **kwargs: Any) -> KVCacheCoordinator:
    """No prefix cache when caching is off, unitary for one group, hybrid otherwise."""
    if not kwargs["enable_caching"]:
        return NoPrefixCacheCoordinator(kv_cache_config, **kwargs)
    if len(kv_cache_config.kv_cache_groups) == 1:
        return UnitaryCoordinator(kv_cache_config, **kwargs)
    return HybridCoordinator(kv_cache_config, **kwargs)
