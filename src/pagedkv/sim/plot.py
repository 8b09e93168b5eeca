"""Hit rate against cache size (matplotlib is imported only here, only when called)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from pagedkv.errors import ConfigError
from pagedkv.sim.run import SweepPoint


def plot_sweep(
    points: Sequence[SweepPoint], path: str | Path, *, title: str, block_size: int
) -> None:
    """Write a PNG of LRU and bound hit rates against cache size in tokens."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ConfigError("--plot needs matplotlib: pip install 'pagedkv[plot]'") from None
    tokens = [p.num_blocks * block_size for p in points]
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    ax.plot(tokens, [100 * p.hit_rate for p in points], "o-", label="LRU (pagedkv manager)")
    bound = [p.bound_hit_rate for p in points]
    if all(b is not None for b in bound):
        ax.plot(tokens, [100 * (b or 0.0) for b in bound], "s--", label="clairvoyant bound")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("KV cache size (tokens)")
    ax.set_ylabel("prefix-cache hit rate (% of prompt tokens)")
    ax.set_ylim(bottom=0)
    ax.set_title(title, fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
