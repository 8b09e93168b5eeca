"""vLLM's ``vllm.v1.core.kv_cache_coordinator``: a view of the pagedkv coordinator a
``KVCacheManager`` built, with vLLM's names (``single_type_managers``, ...)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from pagedkv.compat.vllm.v1.core._dcp import dcp_sharded
from pagedkv.compat.vllm.v1.core.block_pool import BlockPool
from pagedkv.compat.vllm.v1.core.kv_cache_utils import KVCacheBlock
from pagedkv.compat.vllm.v1.core.single_type_kv_cache_manager import (
    CrossAttentionManager,
    SingleTypeKVCacheManager,
    wrapper_class_for,
)
from pagedkv.runtime import coordinators as _coord
from pagedkv.runtime.managers.base import HitQuery

__all__ = [
    "HybridKVCacheCoordinator",
    "KVCacheCoordinator",
    "KVCacheCoordinatorNoPrefixCache",
    "SpecGroup",
    "UnitaryKVCacheCoordinator",
]


class KVCacheCoordinator:
    """vLLM's coordinator API over ``impl`` (pagedkv's coordinator)."""

    def __init__(
        self,
        impl: _coord.KVCacheCoordinator,
        block_pool: BlockPool,
        kv_cache_config: Any,
        scheduler_block_size: int,
        retention_interval: int | None,
        use_eagle: bool = False,
        dcp_world_size: int = 1,
    ) -> None:
        self.impl = impl
        self.block_pool = block_pool
        self.kv_cache_config = kv_cache_config
        self.scheduler_block_size = scheduler_block_size
        self._retention_interval = retention_interval
        self.on_retention_change: Any = None  # the KVCacheManager's runtime setter
        self.use_eagle = use_eagle
        self.enable_caching = impl.enable_caching
        self.hash_block_size = impl.hash_block_size
        self.single_type_managers: tuple[SingleTypeKVCacheManager, ...] = tuple(
            wrapper_class_for(m, g.role)(
                m.kv_cache_spec,
                block_pool,
                scheduler_block_size=scheduler_block_size,
                dcp_world_size=dcp_world_size if dcp_sharded(g.kv_cache_spec) else 1,
                impl=m,
            )
            for m, g in zip(impl.managers, kv_cache_config.kv_cache_groups, strict=True)
        )

    @property
    def retention_interval(self) -> int | None:
        return self._retention_interval

    @retention_interval.setter
    def retention_interval(self, interval: int | None) -> None:
        if self.on_retention_change is not None:
            self.on_retention_change(interval)
        self._retention_interval = interval

    enable_partial_hash_hits = False  # the KVCacheManager sets the runtime's answer

    @property
    def _cache_hit_alignment_tokens(self) -> int:
        """Tokens hits land on: the hash block with partial hits, else the scheduler block."""
        return int(self.impl.alignment_tokens)

    def get_blocks(self, request_id: str) -> tuple[list[KVCacheBlock], ...]:
        return tuple(m.req_to_blocks.get(request_id, []) for m in self.single_type_managers)

    def find_longest_cache_hit(
        self, block_hashes: list[Any], max_cache_hit_length: int
    ) -> tuple[tuple[list[KVCacheBlock], ...], int, int]:
        lists, num_hit, longest = self.impl.find_longest_cache_hit(
            block_hashes, max_cache_hit_length
        )
        blocks = tuple(self.block_pool.ids_to_blocks(ids) for ids in lists)
        return blocks, num_hit, (longest - num_hit if longest > num_hit else 0)

    def find_longest_cache_hit_per_group(
        self, block_hashes: list[Any], max_cache_hit_length: int
    ) -> tuple[tuple[list[KVCacheBlock], ...], tuple[int, ...]]:
        """Each spec group's own hit (pagedkv's search of its kind), not combined; an EAGLE
        group looks one block past the bound first, as in the combined search."""
        impl = self.impl
        num_hashed = len(block_hashes) * impl.hash_block_size
        blocks: list[list[KVCacheBlock]] = [[] for _ in impl.managers]
        lengths = [0] * len(impl.managers)
        for sg in impl.spec_groups:
            bound = max_cache_hit_length
            if sg.use_eagle and sg.manager_cls.looks_past_eagle_block and impl.eagle_margin:
                bound = min(bound + impl._eagle_margin(sg), num_hashed)
            query = HitQuery(
                block_hashes,
                bound,
                sg.group_ids,
                impl.block_pool,
                sg.spec,
                impl.alignment_tokens,
                impl.hash_block_size,
                drop_eagle_block=sg.use_eagle,
            )
            found, hit = sg.manager_cls.find_longest_cache_hit(query)
            for gid, ids in zip(sg.group_ids, found, strict=True):
                blocks[gid] = self.block_pool.ids_to_blocks(ids)
                lengths[gid] = hit
        return tuple(blocks), tuple(lengths)

    def get_num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: tuple[Sequence[KVCacheBlock], ...],
        num_encoder_tokens: int,
        total_computed_tokens: int,
        num_local_computed_tokens: int,
        num_tokens_main_model: int,
        apply_admission_cap: bool = False,
        prefill_end: int = 0,
    ) -> int:
        """Blocks every group needs for the request (tables untouched; a Mamba group notes
        or drops its checkpoint plan, unless ``apply_admission_cap``); a cross-attention
        group sizes its one allocation by the encoder tokens. ``prefill_end`` counts
        only under retention interval 0 (any other interval checkpoints every chunk)."""
        if self.retention_interval != 0:
            prefill_end = 0
        total = 0
        for manager, computed in zip(self.single_type_managers, new_computed_blocks, strict=True):
            if isinstance(manager, CrossAttentionManager):
                total += manager.get_num_blocks_to_allocate(
                    request_id,
                    num_encoder_tokens,
                    [],
                    0,
                    0,
                    num_encoder_tokens,
                    apply_admission_cap=apply_admission_cap,
                )
                continue
            total += manager.get_num_blocks_to_allocate(
                request_id,
                num_tokens,
                computed,
                total_computed_tokens,
                num_local_computed_tokens,
                num_tokens_main_model,
                apply_admission_cap=apply_admission_cap,
                prefill_end=prefill_end,
            )
        return total

    def free(self, request_id: str) -> None:
        for m in self.single_type_managers:
            m.free(request_id)

    def new_step_starts(self) -> None:
        for m in self.single_type_managers:
            m.new_step_starts()


class KVCacheCoordinatorNoPrefixCache(KVCacheCoordinator):
    """The coordinator of a manager without prefix caching."""


class UnitaryKVCacheCoordinator(KVCacheCoordinator):
    """The coordinator of a one-group model."""


class SpecGroup(NamedTuple):
    """vLLM's lookup group: groups with equal spec and manager class, searched together
    (pagedkv's ``SpecGroup`` with vLLM's manager classes and a list of group ids)."""

    spec: Any
    group_ids: list[int]
    manager_cls: type[SingleTypeKVCacheManager]
    use_eagle: bool


class HybridKVCacheCoordinator(KVCacheCoordinator):
    """The coordinator of a model with several groups."""

    @property
    def attention_groups(self) -> list[SpecGroup]:
        """The prefix-cacheable groups by spec, in lookup order (pagedkv's spec groups;
        groups that stay out of the cache are in none)."""
        managers = self.single_type_managers
        return [
            SpecGroup(sg.spec, list(sg.group_ids), type(managers[sg.group_ids[0]]), sg.use_eagle)
            for sg in self.impl.spec_groups
        ]


def coordinator_class(enable_caching: bool, num_groups: int) -> type[KVCacheCoordinator]:
    """vLLM's choice of coordinator class (pagedkv's one coordinator does the work)."""
    if not enable_caching:
        return KVCacheCoordinatorNoPrefixCache
    return UnitaryKVCacheCoordinator if num_groups == 1 else HybridKVCacheCoordinator
