"""Printing a replay: the summary table, the sweep table, and notes that explain a result."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.table import Table

from pagedkv.cli.common import format_int, format_percent, stdout_console

__all__ = [
    "notes",
    "summary_table",
    "sweep_table",
    "print_summary",
    "print_sweep",
]


def notes(result: Any, trace: Any) -> list[str]:
    """Plain-language reasons behind figures that would otherwise puzzle."""
    out = []
    if trace.requests and trace.num_shared_prefix_requests == 0:
        out.append(
            "no two requests of this trace start with the same content (an Azure trace gives "
            "token counts, not text, so every prompt is unique): no prefix-cache hit is "
            "possible and the hit rate is 0 by construction"
        )
    if result.requests_rejected_too_long:
        out.append(
            f"{result.requests_rejected_too_long:,} requests were rejected: their prompt does "
            f"not fit max_model_len (raise --max-model-len or give the cache more blocks)"
        )
    return out


def summary_table(result: Any, extra_rows: Sequence[tuple[str, str]] = ()) -> Table:
    """The replay's summary; ``extra_rows`` (an extension's own figures) follow the hit
    rates."""
    table = Table(title=f"{result.model} on {result.trace}", show_header=False)
    table.add_column(style="bold", overflow="fold")
    table.add_column(justify="right", overflow="fold")
    rows = result.summary_rows()
    after = next((i + 1 for i, (name, _) in enumerate(rows) if name.startswith("hit rate (r")), 0)
    for name, value in [*rows[:after], *extra_rows, *rows[after:]]:
        table.add_row(name, value)
    return table


def sweep_table(points: list[Any], block_size: int) -> Table:
    table = Table(title="hit rate against KV cache size")
    for col in ("blocks", "tokens", "LRU hit rate", "bound hit rate", "preemptions"):
        table.add_column(col, justify="right")
    for p in points:
        table.add_row(
            format_int(p.num_blocks),
            format_int(p.num_blocks * block_size),
            format_percent(p.hit_rate),
            format_percent(p.bound_hit_rate),
            format_int(p.preemptions),
        )
    return table


def print_summary(result: Any, trace: Any, extra_rows: Sequence[tuple[str, str]] = ()) -> None:
    console = stdout_console()
    console.print(summary_table(result, extra_rows))
    for note in notes(result, trace):
        console.print(f"note: {note}")


def print_sweep(points: list[Any], block_size: int) -> None:
    stdout_console().print(sweep_table(points, block_size))
