"""vLLM's ``vllm.distributed.kv_transfer.kv_connector.v1.hisparse.connector``: the
scheduler side of the HiSparse connector, over pagedkv's host tier. Each step it runs the
tier's per-step work and packs the transfers, row mirrors (``mirror_window``) and
residency updates for the worker; worker reports go back to the tier. The worker side
(moving bytes) is outside the KV cache layer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pagedkv.runtime.hisparse import OffloadCommand, ResidencyUpdate, RowMirror, mirror_window

__all__ = [
    "HiSparseConnector",
    "HiSparseConnectorMetadata",
    "HiSparseConnectorScheduler",
    "HiSparseConnectorWorkerMetadata",
]


@dataclass
class HiSparseConnectorMetadata:
    command: OffloadCommand | None
    host_block_copies: tuple[Any, ...]
    source_block_ids: tuple[int, ...]
    row_mirrors: dict[str, tuple[RowMirror, ...]]
    all_context_pages_resident: bool
    residency_updates: dict[str, ResidencyUpdate]


def _add_counts(first: dict[int, int], second: dict[int, int]) -> dict[int, int]:
    combined = dict(first)
    for transfer_id, count in second.items():
        combined[transfer_id] = combined.get(transfer_id, 0) + count
    return combined


@dataclass
class HiSparseConnectorWorkerMetadata:
    """One step's worker reports: transfers enqueued and completed (per transfer id)."""

    enqueued_transfer_counts: dict[int, int]
    completed_transfer_counts: dict[int, int]
    completed_host_copy_dst_ids: tuple[int, ...] = ()

    def aggregate(self, other: HiSparseConnectorWorkerMetadata) -> HiSparseConnectorWorkerMetadata:
        """Reports of several workers: counts add up, copies (run by all) are a union."""
        return HiSparseConnectorWorkerMetadata(
            _add_counts(self.enqueued_transfer_counts, other.enqueued_transfer_counts),
            _add_counts(self.completed_transfer_counts, other.completed_transfer_counts),
            tuple({*self.completed_host_copy_dst_ids, *other.completed_host_copy_dst_ids}),
        )


class HiSparseConnectorScheduler:
    def __init__(self, *, async_speculative: bool, draft_kv_lookahead: int = 0) -> None:
        self.coordinator: Any = None
        self.async_speculative = async_speculative
        self.draft_kv_lookahead = draft_kv_lookahead
        self.requests: dict[str, Any] = {}

    def bind_coordinator(self, coordinator: Any) -> None:
        if self.coordinator is not None:
            raise ValueError("HiSparseConnectorScheduler is already bound to a coordinator")
        self.coordinator = coordinator

    def _coordinator(self) -> Any:
        if self.coordinator is None:
            raise ValueError("HiSparseConnectorScheduler has no coordinator (bind_coordinator)")
        return self.coordinator

    def build_connector_meta(self, scheduler_output: Any) -> HiSparseConnectorMetadata:
        coordinator = self._coordinator()
        # The worker rebinds its residency every step, so loads run before the forward.
        scheduler_output.has_sync_kv_loads = True
        starts = {r.req_id: r.num_computed_tokens for r in scheduler_output.scheduled_new_reqs}
        cached = scheduler_output.scheduled_cached_reqs
        starts.update(zip(cached.req_ids, cached.num_computed_tokens))
        scheduled = tuple(
            (request_id, starts[request_id], count)
            for request_id, count in scheduler_output.num_scheduled_tokens.items()
        )
        coordinator.advance_scheduled(
            (rid, min(start + count, self.requests[rid].num_tokens))
            for rid, start, count in scheduled
        )
        command = coordinator.build_offload_command()
        host_block_copies = coordinator.take_host_block_copies()
        group = coordinator.host_group_id
        source_block_ids = [
            block_id for r in scheduler_output.scheduled_new_reqs for block_id in r.block_ids[group]
        ]
        for new_block_ids in cached.new_block_ids:
            if new_block_ids is not None:
                source_block_ids.extend(new_block_ids[group])
        row_mirrors = {}
        for rid, start, count in scheduled:
            unverified = self.requests[rid].num_output_placeholders if self.async_speculative else 0
            first, num_rows = mirror_window(start, count, unverified, self.draft_kv_lookahead)
            row_mirrors[rid] = coordinator.build_row_mirrors(((rid, first, num_rows),))
        return HiSparseConnectorMetadata(
            command,
            host_block_copies,
            tuple(source_block_ids),
            row_mirrors,
            coordinator.all_context_pages_resident(scheduled),
            coordinator.take_residency_updates(scheduler_output.num_scheduled_tokens),
        )

    def update_connector_output(self, connector_output: Any) -> None:
        coordinator = self._coordinator()
        failed = connector_output.failed_recving or ()
        for request_id in connector_output.finished_recving or ():
            coordinator.finish_host_import(request_id, failed=request_id in failed)
        metadata = connector_output.kv_connector_worker_meta
        if metadata is None:
            return
        coordinator.release_completed_host_copies(metadata.completed_host_copy_dst_ids)
        coordinator.update_spills(
            metadata.enqueued_transfer_counts, metadata.completed_transfer_counts
        )


class HiSparseConnector:
    """The connector's scheduler-side calls, forwarded to ``connector_scheduler``."""

    connector_scheduler: HiSparseConnectorScheduler | None = None

    def _scheduler(self) -> HiSparseConnectorScheduler:
        if self.connector_scheduler is None:
            raise ValueError("HiSparseConnector has no scheduler side (a worker-role connector)")
        return self.connector_scheduler

    def get_num_new_matched_tokens(
        self, request: Any, num_computed_tokens: int
    ) -> tuple[int, bool]:
        return 0, False

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        self._scheduler().requests[request.request_id] = request

    def build_connector_meta(self, scheduler_output: Any) -> HiSparseConnectorMetadata:
        return self._scheduler().build_connector_meta(scheduler_output)

    def update_connector_output(self, connector_output: Any) -> None:
        self._scheduler().update_connector_output(connector_output)

    def request_finished_all_groups(
        self, request: Any, block_ids: tuple[list[int], ...]
    ) -> tuple[bool, dict[str, Any] | None]:
        self._scheduler().requests.pop(request.request_id, None)
        return False, None
