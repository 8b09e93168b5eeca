"""``pagedkv simulate --replicas N --router R``: the fleet simulator's output (and sweep)."""

from __future__ import annotations

import json
from typing import Any

import typer

from pagedkv.cli.common import stderr_console, stdout_console

__all__ = [
    "REPLICAS_OPTION",
    "ROUTER_OPTION",
    "WORKERS_OPTION",
    "RAY_OPTION",
    "replica_counts",
    "run_fleet",
]

REPLICAS_OPTION = typer.Option(
    1,
    "--replicas",
    min=1,
    help="Replicas behind a router (fleet simulation; arrivals by timestamp).",
)
ROUTER_OPTION = typer.Option(
    "round-robin",
    "--router",
    help="round-robin, least-loaded, prefix, cost, balanced (the router's default), or "
    "oracle (sees every cache exactly).",
)
WORKERS_OPTION = typer.Option(
    None, "--workers", min=1, help="--sweep points in N local processes [one per CPU]."
)
RAY_OPTION = typer.Option(
    None, "--ray", help="Run sweep points on this Ray cluster (address, or 'local'; ray extra)."
)


def replica_counts(max_replicas: int) -> list[int]:
    """1, 2, 4, ... up to ``max_replicas`` (which is always included)."""
    counts = [1]
    while counts[-1] * 2 < max_replicas:
        counts.append(counts[-1] * 2)
    return sorted({*counts, max_replicas})


def run_fleet(
    setup: Any,
    trace: Any,
    settings: Any,
    *,
    replicas: int,
    router: str,
    sweep: bool,
    bound: bool,
    plot: str | None,
    json_output: bool,
    workers: int | None,
    ray_address: str | None,
) -> None:
    """Simulate one fleet, or (``sweep``) every router at 1, 2, 4 .. ``replicas``.

    Args:
        setup: what every replica runs on.
        trace: the requests, arriving at their timestamps.
        settings: the scheduler settings.
        replicas: engines in the fleet (with ``sweep``: the largest count).
        router: the routing policy's name, when not sweeping.
        sweep: run every router at 1, 2, 4 .. ``replicas`` replicas.
        bound: also simulate one cache of N times the blocks (LRU and clairvoyant bound).
        plot: the PNG file the results are plotted to (None: no plot).
        json_output: print JSON instead of a table.
        workers: local processes for the sweep (None: one per CPU, 1: this process).
        ray_address: a Ray cluster to run the sweep on instead (None: local).
    """
    from pagedkv.sim.fleet.replicas import simulate_fleet
    from pagedkv.sim.fleet.sweep import fleet_sweep

    if sweep:
        results = fleet_sweep(
            setup, trace, replica_counts(replicas), settings=settings, bound=bound,
            workers=workers, ray_address=ray_address,
        )  # fmt: skip
    else:
        results = [simulate_fleet(setup, trace, replicas, router, settings, bound=bound)]
    if plot is not None:
        from pagedkv.sim.fleet.plot import plot_fleet_sweep

        title = f"{setup.model_name}, {trace.name} ({len(trace.requests)} requests)"
        plot_fleet_sweep(results, plot, title=title)
    if json_output:
        print(json.dumps([r.to_dict() for r in results], indent=1))
    else:
        _table(results)


def _table(results: list[Any]) -> None:
    from rich.table import Table

    first = results[0]
    table = Table(
        title=f"{first.trace}: {first.requests} requests, {first.num_blocks_per_replica} "
        "blocks per replica"
    )
    columns = ("replicas", "router", "hit rate", "per replica", "imbalance", "queue delay")
    for col in (*columns, "preemptions", "one N-x cache LRU / bound"):
        table.add_column(col, justify="right")
    for r in results:
        single = "-"
        if r.bound_hit_rate is not None:
            single = f"{100 * (r.single_cache_hit_rate or 0):.2f} / {100 * r.bound_hit_rate:.2f} %"
        table.add_row(
            str(r.num_replicas),
            r.router,
            f"{100 * r.hit_rate:.2f} %",
            " ".join(f"{100 * x.hit_rate:.1f}" for x in r.replicas),
            f"{r.imbalance:.2f}",
            f"{r.mean_queue_delay_steps:.1f} steps",
            str(r.preemptions),
            single,
        )
    stdout_console().print(table)
    stderr_console().print("imbalance: max / mean of time-averaged running requests")
