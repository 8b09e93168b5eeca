"""vLLM's ``vllm.v1.core.single_type_kv_cache_manager``: each vLLM-named manager wraps the
pagedkv manager of its kind (``impl``) and speaks in block objects; every table, hit and
free is pagedkv's."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, MutableMapping, MutableSequence, Sequence
from typing import Any, ClassVar

from pagedkv.compat.vllm._outside import outside_class
from pagedkv.compat.vllm.v1 import kv_cache_interface as _ki
from pagedkv.compat.vllm.v1.core.block_pool import BlockPool
from pagedkv.compat.vllm.v1.core.kv_cache_utils import BlockHashListWithBlockSize, KVCacheBlock
from pagedkv.compat.vllm.v1.kv_cache_spec_registry import KVCacheSpecRegistry
from pagedkv.errors import KVCacheRuntimeError
from pagedkv.runtime import managers as _m
from pagedkv.runtime.managers.base import HitQuery

__all__ = [
    "BlockHashListWithBlockSize",
    "ChunkedLocalAttentionManager",
    "CircularBufferManager",
    "CrossAttentionManager",
    "FullAttentionManager",
    "HiSparseSourceManager",
    "MambaManager",
    "RSWAManager",
    "SingleTypeKVCacheManager",
    "SinkFullAttentionManager",
    "SlidingWindowManager",
    "get_manager_for_kv_cache_spec",
    "register_all_kvcache_specs",
]


class _LiveTable(MutableSequence[KVCacheBlock]):
    """One request's table in block objects, read through to the pagedkv manager's id list
    (as vLLM's list object, it shows the blocks later steps append)."""

    def __init__(self, ids: list[int], pool: BlockPool) -> None:
        self._ids = ids
        self._blocks = pool.blocks

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return [self._blocks[b] for b in self._ids[index]]
        return self._blocks[self._ids[index]]

    def __setitem__(self, index: Any, value: Any) -> None:
        if isinstance(index, slice):
            self._ids[index] = [b.block_id for b in value]
        else:
            self._ids[index] = value.block_id

    def __delitem__(self, index: Any) -> None:
        del self._ids[index]

    def __len__(self) -> int:
        return len(self._ids)

    def insert(self, index: int, value: KVCacheBlock) -> None:
        self._ids.insert(index, value.block_id)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, _LiveTable | list | tuple):
            return list(self) == list(other)
        return NotImplemented

    def __add__(self, other: Iterable[KVCacheBlock]) -> list[KVCacheBlock]:
        return [*self, *other]

    def __repr__(self) -> str:
        return repr(list(self))


class _Tables(MutableMapping[str, list[KVCacheBlock]]):
    """``req_to_blocks`` in block objects over the pagedkv manager's id tables. A read
    gives a live view of the table; a list assigned here stays the request's table as
    vLLM's does: the manager's changes (blocks nulled, added, relocated) are written back
    into it."""

    def __init__(self, manager: SingleTypeKVCacheManager) -> None:
        self._impl = manager.impl
        self._pool = manager.block_pool
        self._assigned: dict[str, list[KVCacheBlock]] = {}

    def __getitem__(self, request_id: str) -> list[KVCacheBlock]:
        ids = self._impl.req_to_blocks[request_id]
        assigned = self._assigned.get(request_id)
        if assigned is None:
            return _LiveTable(ids, self._pool)  # type: ignore[return-value]
        self.write_back(request_id)
        return assigned

    def __setitem__(self, request_id: str, blocks: list[KVCacheBlock]) -> None:
        self._impl.req_to_blocks[request_id] = [b.block_id for b in blocks]
        self._impl.num_cached_block.setdefault(request_id, 0)
        self._assigned[request_id] = blocks

    def __delitem__(self, request_id: str) -> None:
        del self._impl.req_to_blocks[request_id]
        self._impl.num_cached_block.pop(request_id, None)
        self._assigned.pop(request_id, None)

    def __iter__(self) -> Iterator[str]:
        return iter(self._impl.req_to_blocks)

    def __len__(self) -> int:
        return len(self._impl.req_to_blocks)

    def write_back(self, request_id: str) -> None:
        """Bring an assigned list in line with the manager's table (blocks whose id is
        unchanged stay the caller's objects); forget it once the table is gone."""
        assigned = self._assigned.get(request_id)
        if assigned is None:
            return
        ids = self._impl.req_to_blocks.get(request_id)
        if ids is None:
            del self._assigned[request_id]
            return
        if len(assigned) == len(ids) and all(
            b.block_id == i for b, i in zip(assigned, ids, strict=True)
        ):
            return
        blocks = self._pool.blocks
        kept = [b if b.block_id == i else blocks[i] for b, i in zip(assigned, ids, strict=False)]
        assigned[:] = kept + [blocks[i] for i in ids[len(kept) :]]

    def pop_assigned(self, request_id: str) -> list[KVCacheBlock] | None:
        return self._assigned.pop(request_id, None)


def _ids(blocks: Sequence[KVCacheBlock]) -> list[int]:
    return [b.block_id for b in blocks]


class SingleTypeKVCacheManager:
    """vLLM's per-group manager API over ``impl``, a pagedkv manager of ``impl_class``."""

    impl_class: ClassVar[type[_m.SingleTypeKVCacheManager]] = _m.FullAttentionManager

    def __init__(
        self,
        kv_cache_spec: Any,
        block_pool: BlockPool,
        enable_caching: bool = True,
        kv_cache_group_id: int = 0,
        scheduler_block_size: int | None = None,
        dcp_world_size: int = 1,
        pcp_world_size: int = 1,
        needs_kv_cache_zeroing: bool = False,
        max_admission_blocks_per_request: int | None = None,
        *,
        impl: _m.SingleTypeKVCacheManager | None = None,
        max_model_len: int | None = None,
        max_in_flight_tokens: int | None = None,
        **kwargs: Any,
    ) -> None:
        if impl is None:
            impl = self.impl_class(
                kv_cache_spec,
                block_pool.impl,
                kv_cache_group_id=kv_cache_group_id,
                enable_caching=enable_caching,
                hash_block_size=block_pool.hash_block_size,
                alignment_tokens=scheduler_block_size,
                max_model_len=max_model_len,
                in_flight_tokens=max_in_flight_tokens,
                record_new_block_ids=needs_kv_cache_zeroing,
            )
        self.impl = impl
        self.kv_cache_spec = impl.kv_cache_spec
        self.block_size = impl.block_size
        self.block_pool = block_pool
        self.enable_caching = impl.enable_caching
        self.kv_cache_group_id = impl.kv_cache_group_id
        self.scheduler_block_size = scheduler_block_size or impl.alignment_tokens
        self.dcp_world_size = dcp_world_size
        self.pcp_world_size = pcp_world_size
        self.max_admission_blocks_per_request = max_admission_blocks_per_request
        self.req_to_blocks = _Tables(self)
        self._null_block = block_pool.null_block
        # The runtime caches a group through this manager's ``cache_blocks``, so an
        # override (a subclass, or a test's spy on the instance) sees the call, as in vLLM.
        impl.cache_blocks = self._cache_blocks_for_runtime  # type: ignore[method-assign]

    @property
    def cache_hit_alignment_tokens(self) -> int:
        """Token granularity of this group's cache hits (pagedkv's ``alignment_tokens``)."""
        return self.impl.alignment_tokens

    @property
    def num_cached_block(self) -> dict[str, int]:
        return self.impl.num_cached_block

    def get_num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: Sequence[KVCacheBlock],
        total_computed_tokens: int,
        num_local_computed_tokens: int | None = None,
        num_tokens_main_model: int | None = None,
        apply_admission_cap: bool = False,
        prefill_end: int = 0,
    ) -> int:
        main = num_tokens if num_tokens_main_model is None else num_tokens_main_model
        return self.impl.get_num_blocks_to_allocate(
            request_id,
            num_tokens,
            _ids(new_computed_blocks),
            total_computed_tokens,
            main,
            apply_admission_cap,
            prefill_end,
        )

    def add_local_computed_blocks(
        self,
        request_id: str,
        new_computed_blocks: Sequence[KVCacheBlock],
        num_local_computed_tokens: int,
        num_external_computed_tokens: int = 0,
    ) -> None:
        total = num_local_computed_tokens + num_external_computed_tokens
        local = num_local_computed_tokens if num_external_computed_tokens else None
        self.impl.add_local_computed_blocks(request_id, _ids(new_computed_blocks), total, local)
        self.req_to_blocks.pop_assigned(request_id)  # a new table

    def allocate_external_computed_blocks(
        self,
        request_id: str,
        num_local_computed_tokens: int,
        num_external_computed_tokens: int,
        record_for_zeroing: bool = True,
    ) -> None:
        """Blocks for tokens a KV connector loads: the table grows to cover them
        (``record_for_zeroing`` False: the load writes them, so they are not zeroed)."""
        if num_external_computed_tokens <= 0:
            return
        total = num_local_computed_tokens + num_external_computed_tokens
        impl = self.impl
        impl.req_to_blocks.setdefault(request_id, [])
        impl.num_cached_block.setdefault(request_id, 0)
        num_recorded = len(impl.new_block_ids)
        impl.allocate_external_computed_blocks(request_id, total)
        self.req_to_blocks.write_back(request_id)
        if not record_for_zeroing:
            del impl.new_block_ids[num_recorded:]

    @property
    def records_new_block_ids(self) -> bool:
        return self.impl.records_new_block_ids

    @property
    def new_block_ids(self) -> list[int]:
        return self.impl.new_block_ids

    def take_new_block_ids(self) -> list[int]:
        return self.impl.take_new_block_ids()

    def allocate_new_blocks(
        self, request_id: str, num_tokens: int, num_tokens_main_model: int | None = None
    ) -> list[KVCacheBlock]:
        self.impl.req_to_blocks.setdefault(request_id, [])
        self.impl.num_cached_block.setdefault(request_id, 0)
        main = num_tokens if num_tokens_main_model is None else num_tokens_main_model
        new = self.impl.allocate_new_blocks(request_id, num_tokens, main)
        self.req_to_blocks.write_back(request_id)
        return self.block_pool.ids_to_blocks(new)

    def cache_blocks(self, request: Any, num_tokens: int, *args: Any, **kwargs: Any) -> None:
        type(self.impl).cache_blocks(self.impl, request, num_tokens)

    def _cache_blocks_for_runtime(self, request: Any, num_tokens: int) -> None:
        self.cache_blocks(request, num_tokens)

    def free(self, request_id: str) -> None:
        self.impl.free(request_id)
        self.req_to_blocks.pop_assigned(request_id)

    def pop_blocks_for_free(self, request_id: str) -> list[KVCacheBlock]:
        """The request's table without its null head (the table itself when it has none)."""
        self.req_to_blocks.write_back(request_id)
        assigned = self.req_to_blocks.pop_assigned(request_id)
        table = self.impl.pop_blocks_for_free(request_id)
        start = next((i for i, b in enumerate(table) if b), len(table))
        if assigned is not None:
            return assigned[start:] if start else assigned
        return self.block_pool.ids_to_blocks(table[start:])

    def remove_skipped_blocks(
        self,
        request_id: str,
        processed_computed_tokens: int,
        num_prompt_tokens: int | None = None,
    ) -> None:
        self.impl.remove_skipped_blocks(
            request_id, processed_computed_tokens, num_prompt_tokens=num_prompt_tokens
        )
        self.req_to_blocks.write_back(request_id)

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        return self.impl.get_num_skipped_tokens(num_computed_tokens)

    def new_step_starts(self) -> None:
        self.impl.new_step_starts()

    @classmethod
    def find_longest_cache_hit(
        cls,
        block_hashes: Any,
        max_length: int,
        kv_cache_group_ids: Sequence[int],
        block_pool: BlockPool,
        kv_cache_spec: Any,
        drop_eagle_block: bool = False,
        alignment_tokens: int | None = None,
        dcp_world_size: int = 1,
        pcp_world_size: int = 1,
    ) -> tuple[tuple[list[KVCacheBlock], ...], int]:
        """pagedkv's search of this kind, in block objects."""
        if drop_eagle_block and not cls.impl_class.supports_eagle_block_drop:
            raise NotImplementedError("drop_eagle_block needs pagedkv's EAGLE support")
        if isinstance(block_hashes, BlockHashListWithBlockSize):
            hashes, hash_block_size = block_hashes.block_hashes, block_hashes.hash_block_size
        else:
            # A plain list is hashed at the pool's granularity (when it divides the block).
            hashes, hash_block_size = list(block_hashes), kv_cache_spec.block_size
            pool_unit = block_pool.impl.hash_block_size
            if pool_unit and kv_cache_spec.block_size % pool_unit == 0:
                hash_block_size = pool_unit
        query = HitQuery(
            hashes,
            max_length,
            tuple(kv_cache_group_ids),
            block_pool.impl,
            kv_cache_spec,
            alignment_tokens or kv_cache_spec.block_size,
            hash_block_size,
            drop_eagle_block,
        )
        found, num_tokens = cls.impl_class.find_longest_cache_hit(query)
        return tuple(block_pool.ids_to_blocks(ids) for ids in found), num_tokens

    @classmethod
    def reachable_block_mask(
        cls,
        start_block: int,
        end_block: int,
        alignment_tokens: int | None,
        kv_cache_spec: Any,
        use_eagle: bool,
        retention_interval: int | None = None,
        reachable_boundaries: Sequence[int] = (),
        dcp_world_size: int = 1,
        final_segment_end_block: int | None = None,
    ) -> list[bool] | None:
        """Which of blocks ``[start_block, end_block)`` to cache (None: all of them)."""
        return None


def _mask(keep: set[int] | None, start_block: int, end_block: int) -> list[bool] | None:
    return None if keep is None else [i in keep for i in range(start_block, end_block)]


class FullAttentionManager(SingleTypeKVCacheManager):
    impl_class = _m.FullAttentionManager


class SinkFullAttentionManager(FullAttentionManager):
    pass


class SlidingWindowManager(SingleTypeKVCacheManager):
    impl_class = _m.SlidingWindowManager

    @classmethod
    def reachable_block_mask(
        cls,
        start_block: int,
        end_block: int,
        alignment_tokens: int | None,
        kv_cache_spec: Any,
        use_eagle: bool,
        retention_interval: int | None = None,
        reachable_boundaries: Sequence[int] = (),
        dcp_world_size: int = 1,
        final_segment_end_block: int | None = None,
    ) -> list[bool] | None:
        """pagedkv's sliding-window retention rule; a DCP-sharded block spans
        ``dcp_world_size`` times the spec's tokens."""
        if alignment_tokens is None:
            return None
        spec = kv_cache_spec
        if dcp_world_size > 1:
            spec = spec.copy_with_new_block_size(spec.block_size * dcp_world_size)
        keep = _m.SlidingWindowManager.reachable_positions(
            spec,
            start_block,
            end_block,
            alignment_tokens,
            use_eagle,
            retention_interval,
            reachable_boundaries,
            final_segment_end_block,
        )
        return _mask(keep, start_block, end_block)


class ChunkedLocalAttentionManager(SingleTypeKVCacheManager):
    impl_class = _m.ChunkedLocalAttentionManager


class MambaManager(SingleTypeKVCacheManager):
    impl_class = _m.MambaManager

    @classmethod
    def reachable_block_mask(
        cls,
        start_block: int,
        end_block: int,
        alignment_tokens: int | None,
        kv_cache_spec: Any,
        use_eagle: bool,
        retention_interval: int | None = None,
        reachable_boundaries: Sequence[int] = (),
        dcp_world_size: int = 1,
        final_segment_end_block: int | None = None,
    ) -> list[bool] | None:
        """pagedkv's Mamba retention rule (a state block is whole on every DCP rank)."""
        if alignment_tokens is None:
            return None
        keep = _m.MambaManager.reachable_positions(
            kv_cache_spec.block_size,
            start_block,
            end_block,
            alignment_tokens,
            retention_interval,
            reachable_boundaries,
        )
        return _mask(keep, start_block, end_block)

    @property
    def _checkpoints(self) -> dict[str, Any]:
        """Requests with a prefill checkpoint reserved: pagedkv's record of them."""
        return getattr(self.impl, "_checkpoints", {})

    @property
    def _allocated_block_reqs(self) -> set[str]:
        """Requests that allocated a step's blocks (not only hits): pagedkv's record."""
        allocated: set[str] = self.impl._allocated  # type: ignore[attr-defined]
        return allocated

    def _relocate_speculative_block(self, req_blocks: list[KVCacheBlock], block_idx: int) -> None:
        """pagedkv's relocation on ``req_blocks`` (vLLM's AssertionError for a shared or
        hashed block)."""
        table = _ids(req_blocks)
        try:
            self.impl._relocate_speculative_block(table, block_idx)  # type: ignore[attr-defined]
        except KVCacheRuntimeError as exc:
            raise AssertionError(str(exc)) from exc
        req_blocks[:] = self.block_pool.ids_to_blocks(table)


class CrossAttentionManager(SingleTypeKVCacheManager):
    impl_class = _m.CrossAttentionManager


def _core_manager(name: str, base: type[SingleTypeKVCacheManager]) -> type:
    """The vLLM-named wrapper of pagedkv's manager ``name``, or a placeholder naming it."""
    core = getattr(_m, name, None)
    if core is None:
        return outside_class(name, f"{name} (a manager this pagedkv build does not have)", __name__)
    return type(name, (base,), {"impl_class": core, "__module__": __name__})


RSWAManager = _core_manager("RSWAManager", FullAttentionManager)
CircularBufferManager = _core_manager("CircularBufferManager", FullAttentionManager)
HiSparseSourceManager = _core_manager("HiSparseSourceManager", FullAttentionManager)
HiSparseHotManager = _core_manager("HiSparseHotManager", SingleTypeKVCacheManager)
HiSparseResidentManager = _core_manager("HiSparseResidentManager", SingleTypeKVCacheManager)

# vLLM's built-in table: spec -> (manager, grouping base).
_BUILTINS: tuple[tuple[type, type, type], ...] = (
    (_ki.FullAttentionSpec, FullAttentionManager, _ki.FullAttentionSpec),
    (_ki.HiSparseHotSpec, HiSparseHotManager, _ki.HiSparseHotSpec),
    (_ki.HiSparseResidentSpec, HiSparseResidentManager, _ki.HiSparseResidentSpec),
    (_ki.SlidingWindowSpec, SlidingWindowManager, _ki.SlidingWindowSpec),
    (_ki.CircularBufferSpec, CircularBufferManager, _ki.CircularBufferSpec),
    (_ki.SlidingWindowMLASpec, SlidingWindowManager, _ki.SlidingWindowMLASpec),
    (_ki.MambaSpec, MambaManager, _ki.MambaSpec),
    (_ki.ChunkedLocalAttentionSpec, ChunkedLocalAttentionManager, _ki.ChunkedLocalAttentionSpec),
    (_ki.CrossAttentionSpec, CrossAttentionManager, _ki.CrossAttentionSpec),
    (_ki.MLAAttentionSpec, FullAttentionManager, _ki.FullAttentionSpec),
    (_ki.RSWASpec, RSWAManager, _ki.FullAttentionSpec),
    (_ki.HiddenStateCacheSpec, FullAttentionManager, _ki.FullAttentionSpec),
    (_ki.SinkFullAttentionSpec, SinkFullAttentionManager, _ki.FullAttentionSpec),
)


def register_all_kvcache_specs(vllm_config: Any = None) -> None:
    """vLLM's built-in registrations (in pagedkv's registry they are its own built-ins)."""
    from pagedkv.compat.vllm.v1.kv_cache_spec_registry import (
        _REGISTRY_KVCACHESPEC_LIST,
        KVCacheSpecMetadata,
    )

    KVCacheSpecRegistry.register_role_manager(
        _ki.KVCacheGroupRole.HISPARSE_SOURCE, HiSparseSourceManager
    )
    for spec_cls, manager, base in _BUILTINS:
        if issubclass(spec_cls, _ki.KVCacheSpec) and issubclass(base, _ki.KVCacheSpec):
            meta = KVCacheSpecMetadata(spec_cls, manager, base)
            _REGISTRY_KVCACHESPEC_LIST[spec_cls] = meta


_WRAPPERS: dict[type, type[SingleTypeKVCacheManager]] = {}


def wrapper_class_for(impl: _m.SingleTypeKVCacheManager, role: str | None) -> type:
    """The vLLM-named class for a pagedkv manager the coordinator built."""
    named = KVCacheSpecRegistry.get_manager_class(impl.kv_cache_spec, role)
    if (
        isinstance(named, type)
        and issubclass(named, SingleTypeKVCacheManager)
        and issubclass(type(impl), named.impl_class)
    ):
        return named
    for cls in (
        FullAttentionManager,
        SlidingWindowManager,
        ChunkedLocalAttentionManager,
        MambaManager,
        CrossAttentionManager,
    ):
        if type(impl) is cls.impl_class:
            return cls
    return _WRAPPERS.setdefault(
        type(impl),
        type(type(impl).__name__, (SingleTypeKVCacheManager,), {"impl_class": type(impl)}),
    )


def get_manager_for_kv_cache_spec(
    kv_cache_spec: Any,
    max_in_flight_tokens: int,
    max_model_len: int,
    role: str | None = None,
    **kwargs: Any,
) -> SingleTypeKVCacheManager:
    manager_class = KVCacheSpecRegistry.get_manager_class(kv_cache_spec, role)
    if manager_class is None:
        raise AssertionError(f"No manager registered for KVCacheSpec {type(kv_cache_spec)}")
    return manager_class(
        kv_cache_spec,
        max_model_len=max_model_len,
        max_in_flight_tokens=max_in_flight_tokens,
        **kwargs,
    )
