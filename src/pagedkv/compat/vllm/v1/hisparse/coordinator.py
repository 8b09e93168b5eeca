"""vLLM's ``vllm.v1.hisparse.coordinator`` over pagedkv's host tier
(``pagedkv.runtime.hisparse.HiSparseTier``): the same tier, with vLLM's names and block
objects. The source group moves to a host pool of ``hisparse_host_num_blocks`` blocks
when the coordinator is first built (before any request is admitted)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pagedkv.compat.vllm.v1.core.block_pool import BlockPool
from pagedkv.compat.vllm.v1.core.kv_cache_utils import KVCacheBlock, KVCacheBlockCopy
from pagedkv.compat.vllm.v1.core.single_type_kv_cache_manager import _Tables
from pagedkv.runtime.hisparse import (
    HiSparseTier,
    OffloadCommand,
    PendingTransfer,
    RequestResidency,
    ResidencyUpdate,
    RowMirror,
    bind_hisparse_tier,
)
from pagedkv.runtime.managers import hisparse as _hs

__all__ = ["HiSparseCoordinator", "get_hisparse_coordinator"]


class _GroupView:
    """A vLLM-named manager of one HiSparse group, with the tier's residency reads."""

    def __init__(self, wrapper: Any, tier: HiSparseTier) -> None:
        self._wrapper = wrapper
        self._tier = tier

    def __getattr__(self, name: str) -> Any:
        return getattr(self._wrapper, name)

    def get_resident_page(self, request_id: str, block_idx: int) -> KVCacheBlock | None:
        block = self._tier.resident_page(self._wrapper.impl, request_id, block_idx)
        return None if block is None else self._wrapper.block_pool.blocks[block]

    def get_residency_row(self, request_id: str, start: int = 0) -> list[KVCacheBlock]:
        table = self._wrapper.impl.req_to_blocks.get(request_id, [])
        return self._wrapper.block_pool.ids_to_blocks(table[start:])

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
        """As each group's manager; the host group counts a partial local hit's copy too
        (pagedkv's runtime call has no local-hit argument), then answers as vLLM's: 0
        while the host pool backs the pages, else more than the GPU pool holds."""
        impl = self._wrapper.impl
        if not isinstance(impl, _hs.HiSparseSourceManager):
            return int(
                self._wrapper.get_num_blocks_to_allocate(
                    request_id,
                    num_tokens,
                    new_computed_blocks,
                    total_computed_tokens,
                    num_local_computed_tokens,
                    num_tokens_main_model,
                    apply_admission_cap,
                    prefill_end,
                )
            )
        local = (
            total_computed_tokens
            if num_local_computed_tokens is None
            else num_local_computed_tokens
        )
        main = num_tokens if num_tokens_main_model is None else num_tokens_main_model
        required = impl.get_num_host_blocks_to_allocate(
            request_id,
            num_tokens,
            [b.block_id for b in new_computed_blocks],
            total_computed_tokens,
            local,
            main,
        )
        return impl.gpu_blocks_for(required)

    # hot groups
    def require_hot(self, request_id: str) -> None:
        self._wrapper.impl.require_hot(request_id)

    def has_hot(self, request_id: str) -> bool:
        return bool(self._wrapper.impl.has_hot(request_id))

    @property
    def hot_required(self) -> set[str]:
        return self._wrapper.impl.hot_required

    @property
    def blocks_per_request(self) -> int:
        return self._wrapper.impl.blocks_per_request


def _move_to_pool(wrapper: Any, pool: BlockPool) -> None:
    """Point a vLLM-named manager at the block objects of the pool its impl moved to."""
    wrapper.block_pool = pool
    wrapper.req_to_blocks = _Tables(wrapper)
    wrapper._null_block = pool.null_block


class HiSparseCoordinator:
    """vLLM's coordinator API; ``tier`` is the pagedkv host tier doing the work."""

    def __init__(self, kv_cache_manager: Any) -> None:
        host_num_blocks = getattr(
            kv_cache_manager.kv_cache_config, "hisparse_host_num_blocks", None
        )
        self.tier = tier = bind_hisparse_tier(kv_cache_manager.impl, host_num_blocks)
        wrappers = kv_cache_manager.coordinator.single_type_managers
        for wrapper in wrappers:
            if wrapper.impl.block_pool is not wrapper.block_pool.impl:
                _move_to_pool(wrapper, BlockPool(0, False, 0, impl=wrapper.impl.block_pool))
        self.managers = wrappers
        by_impl = {id(w.impl): w for w in wrappers}
        self.host_group_id = next(
            gid for gid, w in enumerate(wrappers) if w.impl is tier.host_manager
        )
        self.host_manager = _GroupView(by_impl[id(tier.host_manager)], tier)
        self.resident_managers = tuple(
            _GroupView(by_impl[id(m)], tier) for m in tier.resident_managers
        )
        self.hot_managers = tuple(_GroupView(by_impl[id(m)], tier) for m in tier.hot_managers)
        self.gpu_pool: BlockPool = kv_cache_manager.block_pool
        self.has_host_cache = True
        self.max_model_len = tier.max_model_len
        self.num_reprefillable_tokens = tier.num_reprefillable_tokens

    @property
    def max_spill_pages(self) -> int:
        return self.tier.max_spill_pages

    @max_spill_pages.setter
    def max_spill_pages(self, value: int) -> None:
        self.tier.max_spill_pages = value

    @property
    def transition_watermark(self) -> int:
        return self.tier.transition_watermark

    @property
    def request_states(self) -> dict[str, RequestResidency]:
        return self.tier.request_states

    @property
    def spills_to_send(self) -> list[Any]:
        return self.tier.spills_to_send

    @property
    def pending_spills(self) -> dict[int, PendingTransfer]:
        return self.tier.pending_spills

    @property
    def next_spill_id(self) -> int:
        return self.tier.next_spill_id

    def get_host_block_pool(self) -> BlockPool:
        return self.host_manager.block_pool

    def advance_scheduled(self, requests: Iterable[tuple[str, int]]) -> None:
        self.tier.advance_scheduled(requests)

    def plan_prefix_materialization(self, request_id: str, num_computed_tokens: int) -> None:
        self.tier.plan_prefix_materialization(request_id, num_computed_tokens)

    def update_residency(self, request_id: str) -> None:
        self.tier.update_residency(request_id)

    def build_row_mirrors(self, requests: Iterable[tuple[str, int, int]]) -> tuple[RowMirror, ...]:
        return self.tier.build_row_mirrors(requests)

    def all_context_pages_resident(self, requests: Iterable[tuple[str, int, int]]) -> bool:
        return self.tier.all_context_pages_resident(requests)

    def take_residency_updates(self, request_ids: Iterable[str]) -> dict[str, ResidencyUpdate]:
        return self.tier.take_residency_updates(request_ids)

    def build_offload_command(self) -> OffloadCommand:
        return self.tier.build_offload_command()

    def update_spills(
        self, enqueued_counts: Mapping[int, int], completed_counts: Mapping[int, int]
    ) -> None:
        self.tier.update_spills(enqueued_counts, completed_counts)

    def has_pending_work(self) -> bool:
        return self.tier.has_pending_work()

    def has_pending_reclamation(self) -> bool:
        return self.tier.has_pending_reclamation()

    def commit_computed_blocks(self, request_id: str, num_host_pages: int) -> None:
        self.tier.commit_computed_blocks(request_id, num_host_pages)

    def record_pending_host_import(self, request_id: str, num_tokens: int) -> None:
        self.tier.record_pending_host_import(request_id, num_tokens)

    def finish_host_import(self, request_id: str, *, failed: bool) -> None:
        self.tier.finish_host_import(request_id, failed=failed)

    def complete_host_import(self, request_id: str, num_computed_tokens: int) -> None:
        self.tier.complete_host_import(request_id, num_computed_tokens)

    def take_host_block_copies(self) -> tuple[KVCacheBlockCopy, ...]:
        return tuple(KVCacheBlockCopy(s, c) for s, c in self.tier.take_host_block_copies())

    def release_completed_host_copies(self, dst_block_ids: Iterable[int]) -> None:
        self.tier.release_completed_host_copies(dst_block_ids)

    def free(self, request_id: str) -> None:
        self.tier.free(request_id)


def get_hisparse_coordinator(kv_cache_manager: Any) -> HiSparseCoordinator:
    """The coordinator of a KV cache manager's HiSparse groups (built on first call)."""
    coordinator = getattr(kv_cache_manager, "_hisparse_coordinator", None)
    if coordinator is None:
        if not any(
            isinstance(m, _hs.HiSparseSourceManager) for m in kv_cache_manager.impl.managers
        ):
            raise ValueError("No HiSparse cache group is configured.")
        coordinator = HiSparseCoordinator(kv_cache_manager)
        kv_cache_manager._hisparse_coordinator = coordinator
    return coordinator
