"""Plan one KV cache across the ranks of a torch.distributed group.

Every rank sends its layer specs and free memory to every other rank (object
collectives), runs the same deterministic planner on the same inputs and keeps its own
config, so all ranks end with the same ``num_blocks`` and grouping. Failures are shared
rather than left to hang: a rank whose local inputs are bad still joins the gather with
an error in its report, so every rank raises the same error; collectives are bounded by
the group's timeout (set it in ``init_process_group(timeout=...)``) and, on gloo, by a
monitored barrier that names the rank that never arrived.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any, NamedTuple

from pagedkv.config import EngineConfig
from pagedkv.errors import PlanningError
from pagedkv.planning.types import KVCacheConfig
from pagedkv.specs.base import KVCacheSpec

__all__ = [
    "DistributedPlanningError",
    "RankReport",
    "check_reports",
    "plan_digest",
    "plan_across_ranks",
]

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup


class DistributedPlanningError(PlanningError):
    """Ranks could not agree on a KV cache plan (a rank failed, died or disagreed)."""


class RankReport(NamedTuple):
    """What one rank contributes to the gather (or the error that stopped it)."""

    rank: int
    specs: dict[str, KVCacheSpec] | None
    available_memory_bytes: int
    version: str
    error: str | None = None


def _version() -> str:
    from pagedkv._version import __version__

    return __version__


def _local_report(rank: int, specs: Any, available: Any) -> RankReport:
    try:
        if not isinstance(specs, Mapping):
            raise PlanningError(f"local_specs must map layer names to specs, got {type(specs)}")
        for name, spec in specs.items():
            if not isinstance(name, str) or not isinstance(spec, KVCacheSpec):
                raise PlanningError(f"local_specs[{name!r}] is not a KVCacheSpec: {spec!r}")
        if not isinstance(available, int) or isinstance(available, bool) or available < 0:
            raise PlanningError(
                f"local_available_memory must be a non-negative int of bytes, got {available!r}"
            )
        return RankReport(rank, dict(specs), available, _version())
    except Exception as exc:
        return RankReport(rank, None, 0, _version(), f"{type(exc).__name__}: {exc}")


def _failures(outcomes: Sequence[RankReport]) -> str:
    return "; ".join(f"rank {r.rank}: {r.error}" for r in outcomes if r.error is not None)


def check_reports(reports: Sequence[RankReport]) -> None:
    """Raise DistributedPlanningError if any rank failed, pagedkv versions differ, or two
    ranks report different specs for the same layer."""
    if failed := _failures(reports):
        raise DistributedPlanningError(f"KV cache planning failed on {failed}")
    versions = {r.version for r in reports}
    if len(versions) > 1:
        by_rank = ", ".join(f"rank {r.rank}: {r.version}" for r in reports)
        raise DistributedPlanningError(f"ranks run different pagedkv versions ({by_rank})")
    seen: dict[str, tuple[int, KVCacheSpec]] = {}
    for report in reports:
        assert report.specs is not None
        for name, spec in report.specs.items():
            first = seen.setdefault(name, (report.rank, spec))
            if first[1] != spec:
                raise DistributedPlanningError(
                    f"layer {name!r} has different KV cache specs on rank {first[0]} "
                    f"({first[1]!r}) and rank {report.rank} ({spec!r})"
                )


def _gather(obj: Any, group: ProcessGroup | None, what: str) -> list[Any]:
    import torch.distributed as dist

    gathered: list[Any] = [None] * dist.get_world_size(group)
    try:
        dist.all_gather_object(gathered, obj, group=group)
    except Exception as exc:
        raise DistributedPlanningError(
            f"rank {dist.get_rank(group)}: gathering {what} failed ({type(exc).__name__}: "
            f"{exc}); another rank has likely died or timed out"
        ) from exc
    return gathered


def _barrier(group: ProcessGroup | None, timeout: timedelta | None) -> None:
    import torch.distributed as dist

    if timeout is None or dist.get_backend(group) != "gloo":
        return
    try:
        dist.monitored_barrier(group=group, timeout=timeout, wait_all_ranks=True)
    except Exception as exc:
        raise DistributedPlanningError(
            f"rank {dist.get_rank(group)}: not every rank reached KV cache planning within "
            f"{timeout.total_seconds():g} s: {exc}"
        ) from exc


def plan_digest(config: KVCacheConfig) -> str:
    """A short fingerprint of what every rank must agree on: block count, length, layout,
    TP replicas and each group's kind and block size (layer names differ by PP stage)."""
    shape = (
        config.num_blocks,
        config.max_model_len,
        config.kv_cache_layout,
        config.kv_tp_replicas,
        tuple((g.kv_cache_spec.kind, g.kv_cache_spec.block_size) for g in config.kv_cache_groups),
    )
    return hashlib.sha256(repr(shape).encode()).hexdigest()[:16]


def plan_across_ranks(
    config: EngineConfig,
    local_specs: Mapping[str, KVCacheSpec],
    local_available_memory: int,
    group: ProcessGroup | None = None,
    *,
    timeout: timedelta | float | None = None,
) -> KVCacheConfig:
    """This rank's KVCacheConfig, planned from every rank's specs and free memory.

    Ranks are the planner's workers in group-rank order (for TP x PP, rank =
    pp_rank * tp + tp_rank). Works on any backend with object collectives (gloo, NCCL:
    set the CUDA device first). ``timeout`` (seconds or timedelta) bounds a gloo
    monitored barrier before the gather; every collective is also bounded by the group's
    own timeout. Raises DistributedPlanningError on every rank if any rank fails.

    Args:
        config: the engine config, the same on every rank.
        local_specs: this rank's layer name -> KV cache spec.
        local_available_memory: bytes this rank can give the KV cache.
        group: the process group to plan over (None: the default group).
        timeout: seconds (or a timedelta) a gloo monitored barrier waits before the gather (None: no
            barrier bound beyond the group's own timeout).
    """
    import torch.distributed as dist

    from pagedkv.planning.planner import get_kv_cache_configs

    if not dist.is_available() or not dist.is_initialized():
        raise DistributedPlanningError("torch.distributed is not initialized")
    rank = dist.get_rank(group)
    if isinstance(timeout, int | float):
        timeout = timedelta(seconds=timeout)
    _barrier(group, timeout)
    reports: list[RankReport] = _gather(
        _local_report(rank, local_specs, local_available_memory), group, "KV cache specs"
    )
    check_reports(reports)
    specs = [r.specs or {} for r in reports]
    memory = [r.available_memory_bytes for r in reports]
    mine: KVCacheConfig | None = None
    local_error: Exception | None = None
    try:
        mine = get_kv_cache_configs(config, specs, memory)[rank]
    except Exception as exc:  # shared with the other ranks below, then re-raised
        local_error = exc
    error = None if local_error is None else f"{type(local_error).__name__}: {local_error}"
    digest = "" if mine is None else plan_digest(mine)
    outcomes: list[tuple[str | None, str]] = _gather((error, digest), group, "plan outcomes")
    return _agreed(mine, local_error, outcomes)


def _agreed(
    mine: KVCacheConfig | None,
    local_error: Exception | None,
    outcomes: Sequence[tuple[str | None, str]],
) -> KVCacheConfig:
    errors = {e for e, _ in outcomes}
    if local_error is not None and len(errors) == 1:
        raise local_error  # every rank failed the same way: keep the planner's own error
    if failed := [f"rank {r}: {e}" for r, (e, _) in enumerate(outcomes) if e is not None]:
        raise DistributedPlanningError(f"KV cache planning failed on {'; '.join(failed)}")
    if len({d for _, d in outcomes}) > 1:
        raise DistributedPlanningError(
            "ranks planned different KV caches from the same inputs: "
            + ", ".join(f"rank {r}: {d}" for r, (_, d) in enumerate(outcomes))
        )
    assert mine is not None
    return mine
