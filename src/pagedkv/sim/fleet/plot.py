"""Fleet sweep plot: hit rate and imbalance against replicas, one line per router."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from pagedkv.sim.fleet.result import FleetResult
from pagedkv.sim.reports.plot import HIT_RATE_LABEL, new_figure, save_figure

__all__ = [
    "plot_fleet_sweep",
]


def plot_fleet_sweep(results: Sequence[FleetResult], path: str | Path, *, title: str) -> None:
    """Write a PNG: hit rate (with one N-times cache's LRU and bound) and load imbalance."""
    fig = new_figure(figsize=(10, 4.2), dpi=120)
    hit_ax, load_ax = fig.subplots(1, 2)
    routers = list(dict.fromkeys(r.router for r in results))
    for router in routers:
        rows = [r for r in results if r.router == router]
        n = [r.num_replicas for r in rows]
        hit_ax.plot(n, [100 * r.hit_rate for r in rows], "o-", label=router)
        load_ax.plot(n, [r.imbalance for r in rows], "o-", label=router)
    single = {r.num_replicas: r for r in results if r.bound_hit_rate is not None}
    if single:
        n = sorted(single)
        lru = [100 * (single[k].single_cache_hit_rate or 0.0) for k in n]
        hit_ax.plot(n, lru, "k:", label="one N-times cache (LRU)")
        hit_ax.plot(n, [100 * (single[k].bound_hit_rate or 0.0) for k in n], "k--", label="bound")
    hit_ax.set_ylabel(HIT_RATE_LABEL)
    load_ax.set_ylabel("imbalance (max / mean running)")
    for ax in (hit_ax, load_ax):
        ax.set_xlabel("replicas")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    hit_ax.set_ylim(bottom=0)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    save_figure(fig, path)
