"""Sizing HiSparse's tiers: the host pool that backs every page of a request's history,
the GPU hot buffer a request reads host pages into, and how source layers share hot
groups.

Pure arithmetic over byte and token counts; the caller builds groups and specs from it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pagedkv.errors import PlanningError
from pagedkv.specs.base import cdiv

__all__ = [
    "ACTIVE_TAIL_PAGES",
    "MAX_HOT_ROWS",
    "HostPoolPlan",
    "hot_rows_per_request",
    "pack_hot_units",
    "plan_host_pool",
    "steady_state_concurrency",
]

# Resident pages a request reading from the host keeps pinned in each resident group.
ACTIVE_TAIL_PAGES = 2
# Hot-buffer slots are addressed with int16 indices.
MAX_HOT_ROWS = 1 << 15
# Beyond one request's pages the host pool needs its null block and a copy-on-write tail.
_HOST_SPARE_BLOCKS = 2


@dataclass(frozen=True)
class HostPoolPlan:
    """``num_blocks`` host blocks of ``block_stride_bytes`` each."""

    num_blocks: int
    block_stride_bytes: int


def plan_host_pool(
    page_size_bytes: int,
    host_budget_bytes: int,
    *,
    max_model_len: int,
    block_size: int,
    alignment_bytes: int = 1,
) -> HostPoolPlan:
    """The host blocks a budget holds, each page padded to ``alignment_bytes``. Every
    computed page needs a host block, so one ``max_model_len`` request must fit.

    Args:
        page_size_bytes: bytes of one host page before padding.
        host_budget_bytes: host memory the pool may take, in bytes.
        max_model_len: the longest request in tokens; its pages must all fit.
        block_size: tokens per block.
        alignment_bytes: each page's stride is rounded up to a multiple of this, in bytes.
    """
    if page_size_bytes <= 0 or alignment_bytes <= 0:
        raise PlanningError(
            f"HiSparse host pool: page_size_bytes ({page_size_bytes}) and alignment_bytes "
            f"({alignment_bytes}) must be > 0"
        )
    stride = cdiv(page_size_bytes, alignment_bytes) * alignment_bytes
    num_blocks = host_budget_bytes // stride
    if num_blocks <= 0:
        raise PlanningError(
            f"HiSparse host pool: a budget of {host_budget_bytes} bytes holds no "
            f"{stride}-byte block"
        )
    needed = cdiv(max_model_len, block_size) + _HOST_SPARE_BLOCKS
    if num_blocks < needed:
        raise PlanningError(
            f"HiSparse host pool has {num_blocks} blocks but max_model_len {max_model_len} "
            f"needs {needed}; increase host_pool_gib"
        )
    return HostPoolPlan(num_blocks, stride)


def hot_rows_per_request(
    top_k: int, max_decode_query_len: int, device_buffer_size: int | None = None
) -> int:
    """Rows of a request's hot buffer: by default every decode query's top-k plus one
    top-k of slack; a configured size must cover every decode query's top-k."""
    needed = max_decode_query_len * top_k
    rows = (max_decode_query_len + 1) * top_k if device_buffer_size is None else device_buffer_size
    if rows < needed:
        raise PlanningError(
            f"HiSparse device_buffer_size must cover every decode query's index_topk rows: "
            f"got {rows}, need {max_decode_query_len} x {top_k} = {needed}"
        )
    if rows > MAX_HOT_ROWS:
        raise PlanningError(
            f"HiSparse device_buffer_size {rows} exceeds the int16 slot limit {MAX_HOT_ROWS}"
        )
    return rows


def pack_hot_units(
    units: Sequence[Sequence[tuple[str, int]]], budget_bytes: int
) -> list[list[tuple[str, int]]]:
    """Pack units of ``(layer, page bytes)`` (an index group's layers stay together) into
    hot groups, starting a new group when the next unit would take one past
    ``budget_bytes`` per block (a unit alone may exceed it)."""
    groups: list[list[tuple[str, int]]] = []
    current: list[tuple[str, int]] = []
    current_bytes = 0
    for unit in units:
        unit_bytes = sum(size for _, size in unit)
        if current and current_bytes + unit_bytes > budget_bytes:
            groups.append(current)
            current, current_bytes = [], 0
        current.extend(unit)
        current_bytes += unit_bytes
    if current:
        groups.append(current)
    return groups


def steady_state_concurrency(
    num_gpu_blocks: int,
    admission_blocks: int,
    steady_blocks: int,
    host_num_blocks: int,
    host_blocks_per_request: int,
) -> float:
    """Requests of ``max_model_len`` that run at once once they read from the host: all
    but the newest hold their steady footprint (``steady_blocks``: resident groups only
    their active tail), the newest its full admission window (``admission_blocks``);
    the host pool, holding every page, bounds it too.

    Args:
        num_gpu_blocks: device blocks available to requests.
        admission_blocks: device blocks the newest request holds while admitted.
        steady_blocks: device blocks each older request holds once it reads from the host.
        host_num_blocks: blocks in the host pool.
        host_blocks_per_request: host blocks one ``max_model_len`` request takes.
    """
    for name, value in (
        ("admission_blocks", admission_blocks),
        ("steady_blocks", steady_blocks),
        ("host_blocks_per_request", host_blocks_per_request),
    ):
        if value <= 0:
            raise PlanningError(f"steady_state_concurrency: {name} must be > 0, got {value}")
    if num_gpu_blocks < admission_blocks:
        gpu = num_gpu_blocks / admission_blocks
    else:
        gpu = 1 + (num_gpu_blocks - admission_blocks) / steady_blocks
    return min(gpu, host_num_blocks / host_blocks_per_request)
