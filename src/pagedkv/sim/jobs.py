"""Independent simulation jobs (sweep points): run in this process, in local worker
processes (the default), or on a Ray cluster. A job is a pure function of its inputs,
so its result is the same whatever runs it."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from typing import Any

from pagedkv.errors import ConfigError

__all__ = [
    "Job",
    "run_jobs",
]

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
    CPU, 1: this process); ``ray_address``: a Ray cluster (``ray`` extra) instead.

    Args:
        jobs: ``(fn, args)`` pairs; ``fn`` must be importable by name for worker processes.
        workers: local processes (None: one per CPU, 1: this process).
        ray_address: a Ray cluster to run on instead (None: local).
        progress: called with the number of jobs done.
    """
    if ray_address is not None:
        return _run_ray(jobs, ray_address, progress)
    count = min(workers or os.cpu_count() or 1, len(jobs))
    if count <= 1:
        return _gather(jobs, lambda job: _call(*job), progress)
    with ProcessPoolExecutor(count, mp_context=get_context("spawn")) as pool:
        futures = [pool.submit(_call, fn, args) for fn, args in jobs]
        return _gather(futures, lambda future: future.result(), progress)


def _gather(
    pending: Sequence[Any], get: Callable[[Any], Any], progress: Callable[[int], None] | None
) -> list[Any]:
    """``get`` of each pending item, in order, reporting the count done after each."""
    results = []
    for done, item in enumerate(pending, 1):
        results.append(get(item))
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
    return _gather(refs, ray.get, progress)
