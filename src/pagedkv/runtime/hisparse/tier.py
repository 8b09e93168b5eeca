"""HiSparse's host tier: the host pool holds every page of a request's history and the
GPU resident pages are a write-back cache of it.

The tier plans the write-backs (one ``PageTransfer`` per sealed page), counts worker
completions, marks pages clean once every worker has written them, publishes a host
prefix to the prefix cache only once all of its pages are durable, and tells the worker
which GPU block each resident page lives in. Clean pages stay pinned until the request is
freed: the tier never hands a GPU page back to the pool while the request may read it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pagedkv.errors import KVCacheRuntimeError
from pagedkv.runtime.block_pool import NULL_BLOCK
from pagedkv.runtime.hisparse.host_pool import HostBlockPool
from pagedkv.runtime.hisparse.state import PendingTransfer, Publication, RequestResidency
from pagedkv.runtime.hisparse.transfers import (
    OffloadCommand,
    PageTransfer,
    ResidencyUpdate,
    RowMirror,
)
from pagedkv.specs.base import cdiv

if TYPE_CHECKING:
    from pagedkv.runtime.kv_cache_manager import KVCacheManager
    from pagedkv.runtime.managers.base import SingleTypeKVCacheManager
    from pagedkv.runtime.managers.hisparse import (
        HiSparseHotManager,
        HiSparseResidentManager,
        HiSparseSourceManager,
    )
    from pagedkv.runtime.request import Request

__all__ = ["HiSparseTier", "ScheduledRows", "bind_hisparse_tier", "mirror_window"]

# (request id, first token of the step, tokens scheduled in the step)
ScheduledRows = tuple[str, int, int]


class HiSparseTier:
    """The host tier of one model: its source (host) group, resident and hot groups.

    Args:
        host_manager: the source (host) group's manager; its pool holds the history.
        resident_managers: the resident groups' managers (one block size, the host's).
        hot_managers: the hot groups' managers.
        max_model_len: tokens a request may reach; bounds the pages spilled per step.
        num_reprefillable_tokens: the last tokens of a step that a later step computes
            again (multi-module MTP); they are not final, so they are not written back.
        num_gpu_blocks: the GPU pool's size; a request starts reading from the host (asks
            for its hot region) once free GPU blocks fall below a tenth of it, or below
            the hot regions' size, or once it holds the resident pages admission
            reserved for it.
    """

    def __init__(
        self,
        host_manager: HiSparseSourceManager,
        resident_managers: Sequence[HiSparseResidentManager],
        hot_managers: Sequence[HiSparseHotManager],
        *,
        max_model_len: int,
        num_reprefillable_tokens: int = 0,
        num_gpu_blocks: int,
    ) -> None:
        if not resident_managers:
            raise KVCacheRuntimeError("HiSparseTier needs at least one HiSparse resident group")
        sizes = {m.block_size for m in resident_managers}
        if len(sizes) != 1:
            raise KVCacheRuntimeError(
                f"HiSparseTier: resident groups use block sizes {sorted(sizes)}, expected one"
            )
        self.block_size = sizes.pop()
        if host_manager.block_size != self.block_size:
            raise KVCacheRuntimeError(
                f"HiSparseTier: host group block size {host_manager.block_size} differs from "
                f"the resident groups' {self.block_size}"
            )
        if num_reprefillable_tokens < 0:
            raise KVCacheRuntimeError(
                "HiSparseTier.num_reprefillable_tokens must be >= 0, "
                f"got {num_reprefillable_tokens}"
                f"got {num_reprefillable_tokens}"
            )
        self.host_manager = host_manager
        self.resident_managers = tuple(resident_managers)
        self.hot_managers = tuple(hot_managers)
        self.host_pool = host_manager.block_pool
        self.gpu_pool = self.resident_managers[0].block_pool
        self.max_model_len = max_model_len
        self.num_reprefillable_tokens = num_reprefillable_tokens
        self.max_spill_pages = max_model_len // self.block_size  # transfers per step
        hot_cost = sum(m.blocks_per_request for m in self.hot_managers)
        self.transition_watermark = max(hot_cost, num_gpu_blocks // 10)
        self.request_states: dict[str, RequestResidency] = {}
        self.spills_to_send: list[PageTransfer] = []
        self.pending_spills: dict[int, PendingTransfer] = {}
        self.next_spill_id = 0
        self._pending_imports: dict[str, int] = {}  # request -> tokens a load is filling
        self._finished: set[str] = set()  # marked finished, not yet freed
        self._host_copies: dict[int, int] = {}  # copy-on-write copy -> source, in flight
        host_manager.tier = self
        for manager in (*self.resident_managers, *self.hot_managers):
            manager.tier = self

    def state(self, request_id: str) -> RequestResidency:
        """The request's residency bookkeeping (created on first use)."""
        state = self.request_states.get(request_id)
        if state is None:
            state = self.request_states[request_id] = RequestResidency()
        return state

    @staticmethod
    def resident_page(manager: SingleTypeKVCacheManager, request_id: str, page: int) -> int | None:
        """The GPU block a resident group holds page ``page`` in; None if host-only."""
        table = manager.req_to_blocks.get(request_id)
        if table is None or page >= len(table) or table[page] == NULL_BLOCK:
            return None
        return table[page]

    def _page_blocks(self, request_id: str, page: int) -> tuple[int, ...] | None:
        blocks = [self.resident_page(m, request_id, page) for m in self.resident_managers]
        if None in blocks:
            return None
        return tuple(blocks)  # type: ignore[arg-type]

    # -- per-step residency work -------------------------------------------------------

    def advance_scheduled(self, requests: Iterable[tuple[str, int]]) -> None:
        """Per-step work for each ``(request id, tokens computed once the step ends)``:
        plan write-backs of the sealed pages and apply the residency policy."""
        for request_id, num_tokens in requests:
            self.plan_prefix_materialization(
                request_id, max(0, num_tokens - self.num_reprefillable_tokens)
            )
            self.update_residency(request_id)

    def plan_prefix_materialization(self, request_id: str, num_computed_tokens: int) -> None:
        """Plan a write-back of every sealed page without a host copy, within the step's
        transfer budget (``max_spill_pages`` minus transfers not yet sent)."""
        state = self.state(request_id)
        budget = self.max_spill_pages - len(self.spills_to_send)
        importing = cdiv(self._pending_imports.get(request_id, 0), self.block_size)
        first = max(state.ready_prefix_pages, importing)
        for page in range(first, num_computed_tokens // self.block_size):
            if budget <= 0:
                return
            if page in state.pending_pages or page in state.valid_pages:
                continue
            if self._plan_transfer(request_id, page, after_forward=True):
                budget -= 1

    def update_residency(self, request_id: str) -> None:
        """Ask for the request's hot region once the GPU pool runs low or the request
        fills its admission window; it reads host pages from then on."""
        if not self.hot_managers or self.can_read_from_host(request_id):
            return
        free = self.gpu_pool.num_free_blocks
        if free >= self.transition_watermark and not self._fills_admission_window(request_id):
            return
        for manager in self.hot_managers:
            manager.require_hot(request_id)

    def can_read_from_host(self, request_id: str) -> bool:
        """Whether every hot group holds the request's hot region."""
        return bool(self.hot_managers) and all(m.has_hot(request_id) for m in self.hot_managers)

    def _fills_admission_window(self, request_id: str) -> bool:
        for manager in self.resident_managers:
            cap = manager.max_admission_blocks()
            if cap is not None and len(manager.req_to_blocks.get(request_id, ())) >= cap:
                return True
        return False

    def _plan_transfer(
        self, request_id: str, page: int, *, after_forward: bool, restore: bool = False
    ) -> bool:
        state = self.state(request_id)
        if page in state.pending_pages:
            return False
        host_table = self.host_manager.req_to_blocks.get(request_id)
        if host_table is None or page >= len(host_table) or host_table[page] == NULL_BLOCK:
            return False
        resident = self._page_blocks(request_id, page)
        if resident is None:
            return False
        host_block = host_table[page]
        # Both endpoints stay referenced until every worker has run the transfer.
        self.host_pool.touch([host_block])
        self.gpu_pool.touch(resident)
        transfer_id = self.next_spill_id
        self.next_spill_id += 1
        self.spills_to_send.append(
            PageTransfer(transfer_id, host_block, resident, after_forward, restore)
        )
        self.pending_spills[transfer_id] = PendingTransfer(
            transfer_id, request_id, page, state, host_block, resident, restore
        )
        state.pending_pages[page] = transfer_id
        return True

    # -- worker-facing views -----------------------------------------------------------

    def build_offload_command(self) -> OffloadCommand:
        """The transfers planned since the last command."""
        command = OffloadCommand(self.spills_to_send)
        self.spills_to_send = []
        return command

    def build_row_mirrors(self, requests: Iterable[ScheduledRows]) -> tuple[RowMirror, ...]:
        """One mirror per page span the scheduled rows write: resident rows to host rows.
        A page with no GPU copy or no host block is skipped, not the whole window."""
        size = self.block_size
        mirrors: list[RowMirror] = []
        for request_id, start, num_rows in requests:
            host_table = self.host_manager.req_to_blocks.get(request_id)
            if host_table is None:
                continue
            position, end = start, start + num_rows
            while position < end:
                page, offset = divmod(position, size)
                rows = min(size - offset, end - position)
                position += rows
                resident = self._page_blocks(request_id, page)
                if resident is None or page >= len(host_table) or host_table[page] == NULL_BLOCK:
                    continue
                mirrors.append(
                    RowMirror(
                        tuple(block * size + offset for block in resident),
                        host_table[page] * size + offset,
                        rows,
                    )
                )
        return tuple(mirrors)

    def all_context_pages_resident(self, requests: Iterable[ScheduledRows]) -> bool:
        """Whether every scheduled request's pages (through the step) are on the GPU."""
        for request_id, start, num_rows in requests:
            num_pages = cdiv(start + num_rows, self.block_size)
            for manager in self.resident_managers:
                table = manager.req_to_blocks.get(request_id, ())
                if len(table) < num_pages or NULL_BLOCK in table:
                    return False
        return True

    def take_residency_updates(self, request_ids: Iterable[str]) -> dict[str, ResidencyUpdate]:
        """The residency of the pages each request's worker row lacks: those appended
        since its last update (a re-admitted request starts over from page 0)."""
        updates: dict[str, ResidencyUpdate] = {}
        for request_id in request_ids:
            state = self.state(request_id)
            num_pages = len(self.resident_managers[0].req_to_blocks.get(request_id, ()))
            if state.synced_pages >= num_pages:
                continue
            pages = list(range(state.synced_pages, num_pages))
            block_ids = tuple(
                list(m.req_to_blocks[request_id][state.synced_pages : num_pages])
                for m in self.resident_managers
            )
            updates[request_id] = ResidencyUpdate(pages, block_ids)
            state.synced_pages = num_pages
        return updates

    # -- completions -------------------------------------------------------------------

    def update_spills(
        self, enqueued_counts: Mapping[int, int], completed_counts: Mapping[int, int]
    ) -> None:
        """Worker reports: how many workers enqueued each transfer (the first report
        counts) and how many completed it since the last report. A transfer is done once
        every worker that enqueued it has completed it."""
        for transfer_id, count in enqueued_counts.items():
            pending = self.pending_spills.get(transfer_id)
            if pending is not None and pending.expected_completions == 0:
                pending.expected_completions = count
        for transfer_id, count in completed_counts.items():
            pending = self.pending_spills.get(transfer_id)
            if pending is not None:
                pending.completions += count
        done = [p for p in self.pending_spills.values() if p.done]
        touched: dict[str, RequestResidency] = {}
        detached: list[RequestResidency] = []
        for pending in done:
            del self.pending_spills[pending.transfer_id]
            state = pending.state
            state.pending_pages.pop(pending.page, None)
            current = self.request_states.get(pending.request_id) is state
            publication = state.publication
            if current or (publication is not None and publication.detached_blocks is not None):
                if not pending.restore:
                    state.valid_pages.add(pending.page)
                if current:
                    touched[pending.request_id] = state
                else:
                    detached.append(state)
            self.gpu_pool.free_blocks(pending.resident_blocks)
            self.host_pool.free_blocks([pending.host_block])
        for request_id, state in touched.items():
            state.advance_ready_prefix()
            self._publish_ready(request_id)
        for state in detached:
            if not state.pending_pages:
                self._publish_detached(state)

    def has_pending_reclamation(self) -> bool:
        """Whether an in-flight transfer frees a block when it completes: its host block
        is held by the transfer alone (the request was freed), or its request reads
        from the host, so its written-back GPU pages become reclaimable."""
        host_refs = self.host_pool.ref_cnt
        return any(
            host_refs[pending.host_block] == 1
            or (
                pending.request_id in self.request_states
                and self.can_read_from_host(pending.request_id)
            )
            for pending in self.pending_spills.values()
        )

    def has_pending_work(self) -> bool:
        """Whether transfers or host copies are planned or in flight."""
        return bool(self.spills_to_send or self.pending_spills or self._host_copies)

    def take_host_block_copies(self) -> list[tuple[int, int]]:
        """The host group's copy-on-write pairs ``(source, copy)`` (a hit ending inside a
        host block) for the worker; both blocks stay referenced until
        ``release_completed_host_copies`` names the copy."""
        pairs = self.host_manager.take_host_cow_copies()
        for source, copy in pairs:
            self._host_copies[copy] = source
        return pairs

    def release_completed_host_copies(self, copies: Iterable[int]) -> None:
        """The worker ran the host copies into these blocks: release both endpoints."""
        released: list[int] = []
        for copy in copies:
            source = self._host_copies.pop(copy, None)
            if source is not None:
                released += (copy, source)
        self.host_pool.free_blocks(released)

    # -- publication and imports -------------------------------------------------------

    def commit_computed_blocks(self, request_id: str, num_host_pages: int) -> None:
        """A new request adopted ``num_host_pages`` cached host pages: they are clean."""
        host_table = self.host_manager.req_to_blocks.get(request_id, ())
        num_host_pages = min(num_host_pages, len(host_table))
        if num_host_pages <= 0:
            return
        state = self.state(request_id)
        state.valid_pages.update(range(num_host_pages))
        state.ready_prefix_pages = max(state.ready_prefix_pages, num_host_pages)

    def publish_when_ready(self, request: Request, num_tokens: int) -> None:
        """Prefix-cache the request's host pages up to ``num_tokens`` as they become
        durable: now for the clean prefix, the rest as write-backs complete."""
        state = self.state(request.request_id)
        state.publication = Publication(request, num_tokens, num_tokens // self.block_size)
        self._publish_ready(request.request_id)

    def _publish_ready(self, request_id: str) -> None:
        state = self.request_states.get(request_id)
        if state is None or state.publication is None:
            return
        publication = state.publication
        num_tokens = min(publication.num_tokens, state.ready_prefix_pages * self.block_size)
        self.host_manager.publish_blocks(publication.request, num_tokens)
        if state.ready_prefix_pages >= publication.num_pages:
            state.publication = None

    def record_pending_host_import(self, request_id: str, num_tokens: int) -> None:
        """An external load is filling the request's first ``num_tokens`` host rows."""
        self._pending_imports[request_id] = num_tokens

    def finish_host_import(self, request_id: str, *, failed: bool) -> None:
        """The load ended; only a successful one makes its pages readable."""
        num_tokens = self._pending_imports.pop(request_id, None)
        if num_tokens is not None and not failed:
            self.complete_host_import(request_id, num_tokens)

    def complete_host_import(self, request_id: str, num_tokens: int) -> None:
        """The host rows of the first ``num_tokens`` tokens are written: their sealed
        pages are clean (an unsealed tail page is not) and the page holding the last
        token is restored to its GPU block, where the request writes next."""
        num_pages = num_tokens // self.block_size
        state = self.state(request_id)
        state.valid_pages = set(range(num_pages))
        state.ready_prefix_pages = num_pages
        if num_tokens:
            tail = (num_tokens - 1) // self.block_size
            self._plan_transfer(request_id, tail, after_forward=False, restore=True)
        self._publish_ready(request_id)

    def mark_finished(self, request_id: str) -> None:
        """The request ended (stopped, aborted, length-capped): it was not preempted, so
        when freed its in-flight write-backs still publish its prefix."""
        self._finished.add(request_id)

    def _is_finished(self, request_id: str, request: Any) -> bool:
        if request_id in self._finished:
            return True
        is_finished = getattr(request, "is_finished", None)  # an engine's request
        return callable(is_finished) and bool(is_finished())

    def free(self, request_id: str) -> None:
        """Forget the request. Its in-flight transfers keep their endpoints until done.
        A preempted request's publish nothing (a cancelled step's write-back proves no KV
        was computed); a finished request's (``mark_finished``, or a request object whose
        ``is_finished()`` is true) keep its host pages until the last one completes, then
        publish the durable prefix."""
        self._pending_imports.pop(request_id, None)
        finished = request_id in self._finished
        self._finished.discard(request_id)
        state = self.request_states.pop(request_id, None)
        if state is None or state.publication is None:
            return
        publication = state.publication
        if not state.pending_pages or not (
            finished or self._is_finished(request_id, publication.request)
        ):
            state.publication = None
            return
        host = self.host_manager
        blocks = list(host.req_to_blocks.get(request_id, ())[: publication.num_pages])
        publication.detached_blocks = blocks
        publication.num_cached_blocks = host.num_cached_block.get(request_id, 0)
        self.host_pool.touch(blocks)

    def _publish_detached(self, state: RequestResidency) -> None:
        publication = state.publication
        if publication is None or publication.detached_blocks is None:
            return
        state.advance_ready_prefix()
        blocks = publication.detached_blocks
        host = self.host_manager
        num_full = min(state.ready_prefix_pages, publication.num_pages)
        self.host_pool.cache_full_blocks(
            publication.request,
            blocks,
            publication.num_cached_blocks,
            num_full,
            self.block_size,
            host.kv_cache_group_id,
            host.reachable_blocks(publication.request, publication.num_cached_blocks, num_full),
        )
        self.host_pool.free_blocks(reversed(blocks))
        state.publication = None


def mirror_window(
    start: int, num_scheduled: int, num_unverified: int = 0, draft_lookahead: int = 0
) -> tuple[int, int]:
    """The token rows ``(first, count)`` a step may write for one request: its scheduled
    tokens, plus the ``num_unverified`` tokens before them whose drafts are not yet
    accepted or rejected (asynchronous speculation rewrites them) and the draft KV the
    step writes past its tokens. Mirroring this whole range leaves no stale host row.

    Args:
        start: the step's first scheduled token position.
        num_scheduled: tokens scheduled in the step.
        num_unverified: tokens before ``start`` whose drafts are still unverified.
        draft_lookahead: draft tokens the step writes KV for past its scheduled ones.
    """
    first = max(0, start - num_unverified)
    return first, start + num_scheduled - first + draft_lookahead


def bind_hisparse_tier(
    kv_cache_manager: KVCacheManager, host_num_blocks: int | None = None
) -> HiSparseTier:
    """The host tier of a ``KVCacheManager`` whose groups include a HiSparse source
    group: built (and bound to the groups) on the first call, before any request is
    admitted; later calls return the same tier. ``host_num_blocks``: the source group
    moves to a ``HostBlockPool`` of that many blocks (None: it stays in the GPU pool)."""
    managers = kv_cache_manager.managers
    for manager in managers:
        tier: HiSparseTier | None = getattr(manager, "tier", None)
        if tier is not None:
            return tier
    from pagedkv.runtime.managers.hisparse import (
        HiSparseHotManager,
        HiSparseResidentManager,
        HiSparseSourceManager,
    )

    sources = [m for m in managers if isinstance(m, HiSparseSourceManager)]
    if len(sources) != 1:
        raise KVCacheRuntimeError(
            f"bind_hisparse_tier: the model has {len(sources)} HiSparse source groups "
            "(role 'hisparse_source'), expected exactly one"
        )
    if host_num_blocks is not None:
        group_id = managers.index(sources[0])
        pool = HostBlockPool(host_num_blocks, kv_cache_manager.block_pool)
        kv_cache_manager.coordinator.use_pool(group_id, pool)
    return HiSparseTier(
        sources[0],
        [m for m in managers if isinstance(m, HiSparseResidentManager)],
        [m for m in managers if isinstance(m, HiSparseHotManager)],
        max_model_len=kv_cache_manager.max_model_len,
        num_reprefillable_tokens=kv_cache_manager.coordinator.num_reprefillable_tokens,
        num_gpu_blocks=kv_cache_manager.block_pool.num_blocks,
    )
