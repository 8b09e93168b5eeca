"""Hit rate against cache size (matplotlib is imported only here, only when called)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pagedkv.errors import ConfigError
from pagedkv.sim.run import SweepPoint

__all__ = [
    "HIT_RATE_LABEL",
    "new_figure",
    "hit_rate_axes",
    "save_figure",
    "sweep_figure",
    "plot_sweep",
]

HIT_RATE_LABEL = "prefix-cache hit rate (% of prompt tokens)"


def new_figure(**options: Any) -> Any:
    """A matplotlib ``Figure(**options)``, built without pyplot so that no global backend
    is chosen (notebooks keep theirs)."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise ConfigError("plotting needs matplotlib: pip install 'pagedkv[plot]'") from None
    return Figure(**options)


def hit_rate_axes(ax: Any, *, xlabel: str, title: str, legend_size: float | None = None) -> None:
    """The sweep plots' axes: cache size (log 2) against hit rate from 0.

    Args:
        ax: the matplotlib axes.
        xlabel: the x axis label.
        title: the plot title.
        legend_size: the legend's font size (None: matplotlib's default).
    """
    ax.set_xscale("log", base=2)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(HIT_RATE_LABEL)
    ax.set_ylim(bottom=0)
    ax.set_title(title, fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=legend_size)


def save_figure(fig: Any, path: str | Path) -> None:
    """Write ``fig`` (a PNG for a .png path); an unwritable path is a ConfigError."""
    try:
        fig.savefig(path)
    except OSError as exc:
        raise ConfigError(f"cannot write the plot to {path}: {exc.strerror or exc}") from None


def sweep_figure(points: Sequence[SweepPoint], *, title: str, block_size: int) -> Any:
    """LRU and bound hit rates against cache size in tokens, as a matplotlib Figure."""
    tokens = [p.num_blocks * block_size for p in points]
    fig = new_figure(figsize=(7, 4.2), dpi=120)
    ax = fig.subplots()
    ax.plot(tokens, [100 * p.hit_rate for p in points], "o-", label="LRU (pagedkv manager)")
    bound = [p.bound_hit_rate for p in points]
    if all(b is not None for b in bound):
        ax.plot(tokens, [100 * (b or 0.0) for b in bound], "s--", label="clairvoyant bound")
    hit_rate_axes(ax, xlabel="KV cache size (tokens)", title=title)
    fig.tight_layout()
    return fig


def plot_sweep(
    points: Sequence[SweepPoint], path: str | Path, *, title: str, block_size: int
) -> None:
    """Write :func:`sweep_figure` as a PNG.

    Args:
        points: the sweep's results, one per cache size.
        path: the PNG file written.
        title: the plot title.
        block_size: tokens per block, for the axis in tokens.
    """
    save_figure(sweep_figure(points, title=title, block_size=block_size), path)
