"""``pagedkv models`` and ``pagedkv gpus``: what is bundled."""

from __future__ import annotations

import json
from typing import Any

import typer
from rich.table import Table

from pagedkv.cli.common import format_bytes, stdout_console
from pagedkv.models import describe_model, list_bundled_models, list_gpus


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
    for column in ("model", "layers by kind", "params", "dtype", "max len"):
        table.add_column(column, justify="right" if column in ("params", "max len") else "left")
    for row in rows:
        kinds = ", ".join(f"{n} {k}" for k, n in row["layer_kinds"].items())
        length = f"{row['max_model_len']:,}" if row["max_model_len"] else "-"
        table.add_row(row["name"], kinds, f"{row['num_params'] / 1e9:.2f}B", row["dtype"], length)
    stdout_console().print(table)


def gpus_command(
    json_output: bool = typer.Option(False, "--json", help="Print a JSON list."),
) -> None:
    """List the bundled GPU table (memory the plans use, bandwidth, confidence)."""
    gpus = list_gpus()
    if json_output:
        print(
            json.dumps(
                [{**g.__dict__, "planning_memory_bytes": g.planning_memory_bytes} for g in gpus],
                indent=2,
            )
        )
        return
    table = Table(title="Bundled GPUs")
    for column in ("gpu", "memory", "plans use", "bandwidth", "type", "confidence"):
        table.add_column(
            column, justify="right" if column in ("memory", "plans use", "bandwidth") else "left"
        )
    for g in gpus:
        table.add_row(
            g.name,
            f"{g.memory_bytes / 1e9:g} GB",
            format_bytes(g.planning_memory_bytes),
            f"{g.bandwidth_bytes_per_s / 1e12:.2f} TB/s" if g.bandwidth_bytes_per_s else "-",
            g.memory_type,
            g.confidence,
        )
    stdout_console().print(table)
