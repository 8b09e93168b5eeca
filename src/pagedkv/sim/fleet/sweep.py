"""A fleet sweep: every (replica count, router) point is an independent job (see
``sim.jobs``), so the results are the same whatever runs them."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from pagedkv.errors import ConfigError
from pagedkv.sim.fleet.replicas import FLEET_ROUTERS, simulate_fleet, single_cache
from pagedkv.sim.fleet.result import FleetResult
from pagedkv.sim.jobs import Job, run_jobs
from pagedkv.sim.scheduling.scheduler import SchedulerSettings
from pagedkv.sim.setup import SimSetup
from pagedkv.sim.traces.trace import Trace

__all__ = [
    "SWEEP_ROUTERS",
    "fleet_sweep",
]

# the routers a sweep compares unless told otherwise (their documented tables)
SWEEP_ROUTERS = ("round-robin", "least-loaded", "prefix", "cost", "oracle")


def fleet_sweep(
    setup: SimSetup,
    trace: Trace,
    replica_counts: Sequence[int],
    routers: Sequence[str] = SWEEP_ROUTERS,
    settings: SchedulerSettings | None = None,
    *,
    bound: bool = True,
    workers: int | None = None,
    ray_address: str | None = None,
    progress: Callable[[int], None] | None = None,
) -> list[FleetResult]:
    """One fleet run per (replica count, router), plus per count the single N-times cache
    (LRU and clairvoyant bound) when ``bound``; results ordered by count, then router.

    Args:
        setup: what every replica runs on.
        trace: the requests, arriving at their timestamps.
        replica_counts: fleet sizes to run.
        routers: routing policies' names (``FLEET_ROUTERS``).
        settings: the scheduler settings (None: the defaults); arrivals follow timestamps.
        bound: also run one cache of N times the blocks per count.
        workers: local processes (None: one per CPU, 1: this process).
        ray_address: a Ray cluster to run on instead (None: local).
        progress: called with the number of jobs done.
    """
    for router in routers:
        if router not in FLEET_ROUTERS:
            raise ConfigError(f"unknown router {router!r}; known: {', '.join(FLEET_ROUTERS)}")
    settings = dataclasses.replace(settings or SchedulerSettings(), arrivals="timestamp")
    points = [(n, r) for n in replica_counts for r in routers]
    jobs: list[Job] = [(simulate_fleet, (setup, trace, n, r, settings)) for n, r in points]
    if bound:
        jobs += [(single_cache, (setup, trace, settings, n)) for n in replica_counts]
    results = run_jobs(jobs, workers=workers, ray_address=ray_address, progress=progress)
    fleets: list[FleetResult] = results[: len(points)]
    if not bound:
        return fleets
    single = dict(zip(replica_counts, results[len(points) :]))
    return [
        dataclasses.replace(
            f,
            single_cache_hit_rate=single[f.num_replicas][0],
            bound_hit_rate=single[f.num_replicas][1],
        )
        for f in fleets
    ]
