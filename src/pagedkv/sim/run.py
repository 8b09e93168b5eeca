"""One-call entry points: simulate a trace (optionally with the bound) and sweep sizes."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from pagedkv.errors import ConfigError
from pagedkv.sim.reports.bound import AccessLog, belady_bound
from pagedkv.sim.reports.metrics import SimResult
from pagedkv.sim.scheduling.scheduler import SchedulerSettings
from pagedkv.sim.setup import SimSetup, bound_geometry, host_block_tokens
from pagedkv.sim.traces.trace import Trace

__all__ = [
    "simulate",
    "SweepPoint",
    "sweep_dataframe",
    "sweep",
    "sweep_sizes",
]


def simulate(
    setup: SimSetup,
    trace: Trace,
    settings: SchedulerSettings | None = None,
    *,
    bound: bool = False,
    steps_path: str | None = None,
    keep_steps: bool = False,
    progress: Callable[[int], None] | None = None,
    stage: Callable[[str], None] | None = None,
) -> SimResult:
    """Replay ``trace`` on a fresh manager; with ``bound`` also the clairvoyant hit count;
    with ``keep_steps`` the per-step series too (``result.to_dataframe()``). ``stage(name)``
    is called when a phase after the replay starts (``"bound"``).

    The bound is taken over the accesses of vLLM's own schedule: the replay with LRU and
    no host tier at this cache size. With another policy or a host tier that is a second
    replay, so every policy is measured against the same bound.

    Args:
        setup: what the simulation runs on (KV cache config, policy, host tier).
        trace: the requests replayed.
        settings: the scheduler settings (None: the defaults).
        bound: also compute the clairvoyant (Belady) hit count.
        steps_path: a file the per-step records are written to (None: none).
        keep_steps: keep the per-step series in the result.
        progress: called with the requests done, every 256 steps.
        stage: called with a phase's name when a phase after the replay starts.
    """
    geometry = bound_geometry(setup.kv_cache_config) if bound else None
    if bound and geometry is None:
        raise ConfigError(
            "the prefix-cache bound needs a full-attention KV cache group (a window hit "
            "does not need the whole prefix cached)"
        )
    reference = dataclasses.replace(setup, eviction_policy="lru", host_num_blocks=0)
    own_log = bound and setup.eviction_policy == "lru" and not setup.host_num_blocks
    log = AccessLog() if own_log else None
    result = setup.simulator(settings).run(
        trace, access_log=log, steps_path=steps_path, keep_steps=keep_steps, progress=progress
    )
    if not bound or geometry is None:
        return result
    block_size, capacity = geometry
    if stage is not None:
        stage("bound")
    if log is None:
        log = AccessLog()
        reference.simulator(settings).run(trace, access_log=log)
    found = belady_bound(trace.requests, log, block_size, capacity)
    result = dataclasses.replace(result, bound_hit_tokens=found.hit_tokens)
    if setup.host_num_blocks:  # the bound of one cache as large as both tiers
        host = setup.host_num_blocks * host_block_tokens(setup) // block_size
        both = belady_bound(trace.requests, log, block_size, capacity + host)
        result = dataclasses.replace(result, tiered_bound_hit_tokens=both.hit_tokens)
    return result


class SweepPoint(NamedTuple):
    num_blocks: int
    hit_rate: float
    bound_hit_rate: float | None
    preemptions: int


def sweep_dataframe(points: Sequence[SweepPoint]) -> Any:
    """The sweep as a pandas DataFrame, one row per cache size (needs pandas)."""
    from pagedkv.sim.reports.frames import dataframe

    return dataframe([tuple(p) for p in points], SweepPoint._fields)


def sweep(
    setup: SimSetup,
    trace: Trace,
    sizes: Sequence[int],
    settings: SchedulerSettings | None = None,
    *,
    bound: bool = True,
    progress: Callable[[int], None] | None = None,
    workers: int | None = None,
    ray_address: str | None = None,
) -> list[SweepPoint]:
    """Hit rate (LRU and bound) for each block count in ``sizes``; each size is an
    independent job: in local worker processes (``workers``: how many, None: one per CPU,
    1: this process) or on a Ray cluster (``ray_address``), same results either way.

    Args:
        setup: what the simulation runs on; each point resizes it.
        trace: the requests replayed.
        sizes: block counts to simulate.
        settings: the scheduler settings (None: the defaults).
        bound: also compute the clairvoyant hit count at each size.
        progress: called with the number of points done.
        workers: local processes (None: one per CPU, 1: this process).
        ray_address: a Ray cluster to run on instead (None: local).
    """
    from pagedkv.sim.jobs import run_jobs

    jobs = [(_sweep_point, (setup, trace, n, settings, bound)) for n in sizes]
    return run_jobs(jobs, workers=workers, ray_address=ray_address, progress=progress)


def _sweep_point(
    setup: SimSetup,
    trace: Trace,
    num_blocks: int,
    settings: SchedulerSettings | None,
    bound: bool,
) -> SweepPoint:
    result = simulate(setup.with_num_blocks(num_blocks), trace, settings, bound=bound)
    return SweepPoint(num_blocks, result.hit_rate, result.bound_hit_rate, result.preemptions)


def sweep_sizes(num_blocks: int, below: int = 3, above: int = 2) -> list[int]:
    """``num_blocks`` halved ``below`` times and doubled ``above`` times (at least 2 each)."""
    sizes = {max(num_blocks >> i, 2) for i in range(below + 1)}
    sizes |= {num_blocks << i for i in range(1, above + 1)}
    return sorted(sizes)
