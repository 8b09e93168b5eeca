"""HiSparse's groups: the source group holding a request's history on the host, and the
GPU-side hot and resident groups. A ``HiSparseTier`` (``pagedkv.runtime.hisparse``) bound to
them (``tier``) plans the page transfers between the tiers and gates host publication;
unbound, the groups keep plain block tables."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from pagedkv.runtime.block_pool import NULL_BLOCK, BlockPool
from pagedkv.runtime.managers.base import HitQuery, SingleTypeKVCacheManager
from pagedkv.runtime.managers.full import FullAttentionManager
from pagedkv.specs.base import cdiv

__all__ = [
    "HISPARSE_SOURCE_ROLE",
    "TierHooks",
    "HiSparseSourceManager",
    "HiSparseHotManager",
    "HiSparseResidentManager",
]

if TYPE_CHECKING:
    from pagedkv.runtime.request import Request

HISPARSE_SOURCE_ROLE = "hisparse_source"


class TierHooks(Protocol):
    """What the managers call on the bound tier (``pagedkv.runtime.hisparse.HiSparseTier``)."""

    gpu_pool: BlockPool

    def publish_when_ready(self, request: Request, num_tokens: int) -> None: ...

    def commit_computed_blocks(self, request_id: str, num_host_pages: int) -> None: ...

    def free(self, request_id: str) -> None: ...


class HiSparseSourceManager(FullAttentionManager):
    """The host group (role ``hisparse_source``): a full-attention table whose cached
    prefix, once a tier is bound, is published only as its pages become durable. With a
    host pool of its own, admission asks the host pool, not the GPU pool, for its pages."""

    tier: TierHooks | None = None

    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        if self.tier is None:
            super().cache_blocks(request, num_tokens)
        else:
            self.tier.publish_when_ready(request, num_tokens)

    def get_num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: Sequence[int],
        total_computed_tokens: int,
        num_tokens_main_model: int,
        apply_admission_cap: bool = False,
        prefill_end: int = 0,
    ) -> int:
        """Free GPU blocks the allocation consumes: none once a tier moved this group to a
        host pool that can back the pages, else more than the GPU pool holds (no fit).

        Args:
            request_id: the request to allocate for.
            num_tokens: tokens the table must cover after the step, lookahead included.
            new_computed_blocks: the hit's blocks a new request adopts (empty: none).
            total_computed_tokens: tokens computed before the step.
            num_tokens_main_model: ``num_tokens`` without the lookahead tokens.
            apply_admission_cap: cap the count at ``max_admission_blocks``.
            prefill_end: the token the request's prefill ends at (0: take checkpoints
                on every chunk).
        """
        required = super().get_num_blocks_to_allocate(
            request_id,
            num_tokens,
            new_computed_blocks,
            total_computed_tokens,
            num_tokens_main_model,
            apply_admission_cap,
            prefill_end,
        )
        return self.gpu_blocks_for(required)

    def gpu_blocks_for(self, required: int) -> int:
        """GPU-pool blocks an allocation of ``required`` blocks from this group's pool
        counts as: ``required`` while the group is on the GPU pool; on a host pool none,
        or more than the GPU pool holds (no fit) when the host cannot back the pages."""
        tier = self.tier
        if tier is None or self.block_pool is tier.gpu_pool:
            return required
        if required <= self.block_pool.num_free_blocks:
            return 0
        return tier.gpu_pool.num_blocks + 1

    def get_num_host_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: Sequence[int],
        total_computed_tokens: int,
        num_local_computed_tokens: int,
        num_tokens_main_model: int,
    ) -> int:
        """Blocks the allocation takes from this group's own pool (the host pool once a
        tier moved it there). Counts the copy of a local hit that ends inside a block
        even when a KV connector loads the tokens after it.

        Args:
            request_id: the request to allocate for.
            num_tokens: tokens the table must cover after the step.
            new_computed_blocks: the hit's blocks a new request adopts (empty: none).
            total_computed_tokens: tokens computed before the step, a KV connector's
                included.
            num_local_computed_tokens: where the local hit ends.
            num_tokens_main_model: ``num_tokens`` without the lookahead tokens.
        """
        required = FullAttentionManager.get_num_blocks_to_allocate(
            self,
            request_id,
            num_tokens,
            new_computed_blocks,
            total_computed_tokens,
            num_tokens_main_model,
        )
        if not new_computed_blocks or request_id in self.req_to_blocks:
            return required
        copies_local = num_local_computed_tokens % self.block_size != 0
        copies_total = total_computed_tokens % self.block_size != 0
        return required + int(copies_local) - int(copies_total)

    def take_cow_copies(self) -> list[tuple[int, int]]:
        tier = self.tier
        if tier is None or self.block_pool is tier.gpu_pool:
            return super().take_cow_copies()
        return []  # host blocks: the tier hands them to the worker (take_host_cow_copies)

    def take_host_cow_copies(self) -> list[tuple[int, int]]:
        """The copy-on-write pairs of host blocks queued since the last call."""
        return super().take_cow_copies()

    def publish_blocks(self, request: Request, num_tokens: int) -> None:
        """Prefix-cache the full host pages among the first ``num_tokens`` tokens."""
        super().cache_blocks(request, num_tokens)

    def free(self, request_id: str, priority: int = 0) -> None:
        if self.tier is not None:
            self.tier.free(request_id)
        super().free(request_id, priority)


class _HiSparseGPUManager(SingleTypeKVCacheManager):
    """No hits and no caching: the host source group owns prefix caching."""

    tier: TierHooks | None = None

    @classmethod
    def find_longest_cache_hit(cls, query: HitQuery) -> tuple[list[list[int]], int]:
        return [[] for _ in query.group_ids], 0

    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        return


class HiSparseHotManager(_HiSparseGPUManager):
    """A hot region of ``blocks_per_request`` blocks, taken once the request reads host
    history: it resumes a host prefix, or ``require_hot`` asked for it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.blocks_per_request: int = self.kv_cache_spec.blocks_per_request  # type: ignore[attr-defined]
        self.hot_required: set[str] = set()

    def require_hot(self, request_id: str) -> None:
        """The request needs its hot region from its next allocation on."""
        if request_id not in self.hot_required:
            self.hot_required.add(request_id)
            self.block_pool.record(self.hot_required.discard, request_id)

    def has_hot(self, request_id: str) -> bool:
        return len(self.req_to_blocks.get(request_id, ())) == self.blocks_per_request

    def get_num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: Sequence[int],
        total_computed_tokens: int,
        num_tokens_main_model: int,
        apply_admission_cap: bool = False,
        prefill_end: int = 0,
    ) -> int:
        """The hot region's missing blocks once the request resumes a host prefix or
        ``require_hot`` asked for it; else none.

        Args:
            request_id: the request to allocate for.
            num_tokens: unused.
            new_computed_blocks: unused.
            total_computed_tokens: tokens computed before the step (a new request with
                some resumes a host prefix).
            num_tokens_main_model: unused.
            apply_admission_cap: unused.
            prefill_end: unused.
        """
        resumes = total_computed_tokens > 0 and request_id not in self.num_cached_block
        if resumes or request_id in self.hot_required:
            return max(self.blocks_per_request - len(self.req_to_blocks.get(request_id, ())), 0)
        return 0

    def add_local_computed_blocks(
        self,
        request_id: str,
        new_computed_blocks: Sequence[int],
        total_computed_tokens: int,
        num_local_computed_tokens: int | None = None,
    ) -> None:
        """Start an empty table; a request resuming a host prefix needs its hot region.

        Args:
            request_id: the new request.
            new_computed_blocks: unused (hot blocks are never cached).
            total_computed_tokens: tokens computed before the step.
            num_local_computed_tokens: unused.
        """
        super().add_local_computed_blocks(request_id, (), total_computed_tokens)
        if total_computed_tokens > 0:
            self.require_hot(request_id)

    def allocate_new_blocks(
        self, request_id: str, num_tokens: int, num_tokens_main_model: int
    ) -> list[int]:
        table = self.req_to_blocks[request_id]
        num_new = self.blocks_per_request - len(table)
        if request_id not in self.hot_required or num_new <= 0:
            return []
        new = self.block_pool.get_new_blocks(num_new)
        table.extend(new)
        return new

    def free(self, request_id: str, priority: int = 0) -> None:
        self.hot_required.discard(request_id)
        super().free(request_id, priority)


class HiSparseResidentManager(_HiSparseGPUManager):
    """GPU pages for the tokens being computed; a host-resident prefix is null entries
    (the coordinator may point them at pinned copies). Admission is capped at the pages
    of the in-flight tokens."""

    def get_num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: Sequence[int],
        total_computed_tokens: int,
        num_tokens_main_model: int,
        apply_admission_cap: bool = False,
        prefill_end: int = 0,
    ) -> int:
        """GPU pages for the tokens past the host-resident prefix.

        Args:
            request_id: the request to allocate for.
            num_tokens: tokens the table must cover after the step, lookahead included.
            new_computed_blocks: unused.
            total_computed_tokens: tokens computed before the step; their pages stay on
                the host (null entries).
            num_tokens_main_model: unused.
            apply_admission_cap: cap the count at ``max_admission_blocks``.
            prefill_end: unused.
        """
        required = cdiv(num_tokens, self.block_size)
        if apply_admission_cap:
            cap = self.max_admission_blocks()
            if cap is not None and cap < required:
                required = cap
        existing = len(self.req_to_blocks.get(request_id, ()))
        host_pages = cdiv(total_computed_tokens, self.block_size)
        return max(required - max(existing, host_pages), 0)

    def add_local_computed_blocks(
        self,
        request_id: str,
        new_computed_blocks: Sequence[int],
        total_computed_tokens: int,
        num_local_computed_tokens: int | None = None,
    ) -> None:
        """Start the table with a null entry per host-resident page of the hit.

        Args:
            request_id: the new request.
            new_computed_blocks: unused (the host group holds the hit's blocks).
            total_computed_tokens: tokens computed before the step, held on the host.
            num_local_computed_tokens: unused.
        """
        super().add_local_computed_blocks(request_id, (), 0)
        table = self.req_to_blocks[request_id]
        num_host_pages = cdiv(total_computed_tokens, self.block_size)
        table.extend([NULL_BLOCK] * num_host_pages)
        self.num_cached_block[request_id] = 0
        if self.tier is not None:
            self.tier.commit_computed_blocks(request_id, num_host_pages)

    def free(self, request_id: str, priority: int = 0) -> None:
        if self.tier is not None:
            self.tier.free(request_id)
        super().free(request_id, priority)
