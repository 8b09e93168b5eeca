"""Sweeps as independent jobs: in this process, in local worker processes (the default),
or on a Ray cluster. Every job is a pure function of its inputs, so the results are the
same whatever runs them."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from typing import Any

from pagedkv.errors import ConfigError
from pagedkv.sim.engine import SimEngine
from pagedkv.sim.fleet import FLEET_ROUTERS, FleetResult, simulate_fleet, single_cache
from pagedkv.sim.scheduler import SchedulerSettings
from pagedkv.sim.trace import Trace

Job = tuple[Callable[..., Any], tuple[Any, ...]]


def _call(fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
    return fn(*args)


def run_jobs(
    jobs: Sequence[Job],
    *,
    workers: int | None = None,
    ray_address: str | None = None,
    progress: Callable[[int], None] | None = None,
) -> list[Any]:
    """``fn(*args)`` of every job, in order. ``workers``: local processes (None: one per
    CPU, 1: this process); ``ray_address``: a Ray cluster (``ray`` extra) instead."""
    if ray_address is not None:
        return _run_ray(jobs, ray_address, progress)
    count = min(workers or os.cpu_count() or 1, len(jobs))
    if count <= 1:
        results = []
        for done, (fn, args) in enumerate(jobs, 1):
            results.append(fn(*args))
            if progress is not None:
                progress(done)
        return results
    with ProcessPoolExecutor(count, mp_context=get_context("spawn")) as pool:
        futures = [pool.submit(_call, fn, args) for fn, args in jobs]
        results = []
        for done, future in enumerate(futures, 1):
            results.append(future.result())
            if progress is not None:
                progress(done)
        return results


def _run_ray(
    jobs: Sequence[Job], address: str, progress: Callable[[int], None] | None
) -> list[Any]:
    try:
        import ray  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        raise ConfigError("--ray needs the ray package: pip install 'pagedkv[ray]'") from None
    ray.init(address=None if address == "local" else address, ignore_reinit_error=True)
    remote = ray.remote(_call)
    refs = [remote.remote(fn, args) for fn, args in jobs]
    results = []
    for done, ref in enumerate(refs, 1):
        results.append(ray.get(ref))
        if progress is not None:
            progress(done)
    return results


def fleet_sweep(
    engine: SimEngine,
    trace: Trace,
    replica_counts: Sequence[int],
    routers: Sequence[str] = FLEET_ROUTERS,
    settings: SchedulerSettings | None = None,
    *,
    bound: bool = True,
    workers: int | None = None,
    ray_address: str | None = None,
    progress: Callable[[int], None] | None = None,
) -> list[FleetResult]:
    """One fleet run per (replica count, router), plus per count the single N-times cache
    (LRU and clairvoyant bound) when ``bound``; results ordered by count, then router."""
    for router in routers:
        if router not in FLEET_ROUTERS:
            raise ConfigError(f"unknown router {router!r}; known: {', '.join(FLEET_ROUTERS)}")
    settings = dataclasses.replace(settings or SchedulerSettings(), arrivals="timestamp")
    points = [(n, r) for n in replica_counts for r in routers]
    jobs: list[Job] = [(simulate_fleet, (engine, trace, n, r, settings)) for n, r in points]
    if bound:
        jobs += [(single_cache, (engine, trace, settings, n)) for n in replica_counts]
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
