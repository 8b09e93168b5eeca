"""``pagedkv models`` and ``pagedkv gpus``: what is bundled."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import typer
from rich.table import Table

from pagedkv.cli.common import format_bytes, stdout_console
from pagedkv.models import describe_model, list_bundled_models, list_gpus

__all__ = [
    "models_command",
    "gpus_command",
]


def models_command(
    json_output: bool = typer.Option(False, "--json", help="Print a JSON list."),
) -> None:
    """List the bundled model configs with their kinds of layers."""
    rows: list[dict[str, Any]] = []
    for name in list_bundled_models():
        layout = describe_model(name)
        rows.append(
            {
                "name": name,
                "architecture": layout.architecture,
                "layer_kinds": layout.layer_kinds(),
                "num_params": layout.num_params,
                "dtype": layout.dtype,
                "max_model_len": layout.max_model_len,
            }
        )
    if json_output:
        print(json.dumps(rows, indent=2))
        return
    table = Table(title="Bundled models")
    table.add_column("model", overflow="fold")
    table.add_column("layers by kind", overflow="fold")
    for column in ("params", "dtype", "max len"):
        table.add_column(column, justify="left" if column == "dtype" else "right", no_wrap=True)
    for row in rows:
        kinds = ", ".join(f"{n} {k}" for k, n in row["layer_kinds"].items())
        length = f"{row['max_model_len']:,}" if row["max_model_len"] else "-"
        table.add_row(row["name"], kinds, f"{row['num_params'] / 1e9:.2f}B", row["dtype"], length)
    stdout_console().print(table)


def gpus_command(
    json_output: bool = typer.Option(False, "--json", help="Print a JSON list."),
) -> None:
    """List the bundled GPU table (memory the plans use, bandwidth, aliases); --json adds
    memory type, confidence and the rest."""
    gpus = list_gpus()
    if json_output:
        print(
            json.dumps(
                [{**g.__dict__, "planning_memory_bytes": g.planning_memory_bytes} for g in gpus],
                indent=2,
            )
        )
        return
    table = Table(title="Bundled GPUs (`--gpu` takes a name or an alias)")
    table.add_column("gpu", no_wrap=True)
    for column in ("memory", "plans use", "bandwidth"):
        table.add_column(column, justify="right", no_wrap=True)
    table.add_column("aliases", overflow="fold")
    shared = Counter(alias for g in gpus for alias in g.aliases)
    for g in gpus:
        aliases = [f"{a}*" if shared[a] > 1 else a for a in g.aliases]
        table.add_row(
            g.name,
            f"{g.memory_bytes / 1e9:g} GB",
            format_bytes(g.planning_memory_bytes),
            f"{g.bandwidth_bytes_per_s / 1e12:.2f} TB/s" if g.bandwidth_bytes_per_s else "-",
            ", ".join(aliases),
        )
    table.caption = "* shared by several entries: ambiguous, `--gpu` asks you to pick one"
    stdout_console().print(table)
