"""Markdown tables from a side-by-side run of vLLM 0.33's KVCacheManager and pagedkv's.

The run is the vLLM peer toolkit's ``dual_replay.py --json`` (it lives with the shared
tools, outside this repository); this script only renders its JSON: one row per layout
and trace (median calls per second of each manager, the ratio, the per-run ratios,
whether every call was identical) and the seconds per kind of call of the median run.

    python benchmarks/dual_replay_table.py benchmarks/results/dual_replay.json
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

import msgspec

KINDS = (
    ("get_computed_blocks", "lookups"),
    ("allocate_slots_running", "running allocations"),
    ("allocate_slots_admit", "admissions"),
    ("free", "frees"),
)


def _groups(row: dict[str, Any]) -> str:
    kinds: dict[str, int] = {}
    for group in row["kv_cache_groups"]:
        name = group.rsplit("x", 1)[0].removesuffix("Spec")  # "SlidingWindowSpecx9"
        kinds[name] = kinds.get(name, 0) + 1
    return " + ".join(f"{n} {k}" for k, n in kinds.items())


def _trace(row: dict[str, Any]) -> str:
    limit = row["limit"]
    return f"{row['trace']} (first {limit:,})" if limit else f"{row['trace']} ({row['requests']:,})"


def _per_run(row: dict[str, Any]) -> str:
    pairs = zip(row["runs"]["vllm"], row["runs"]["pagedkv"])
    ratios = [p["manager_calls_per_second"] / v["manager_calls_per_second"] for v, p in pairs]
    return ", ".join(f"{r:.2f}" for r in ratios)


def ratio_table(rows: list[dict[str, Any]]) -> str:
    """One line per layout and trace: medians of both managers and their ratio."""
    lines = [
        "| layout | trace | vLLM calls/s | pagedkv calls/s | ratio | per-run ratios | identical |",
        "|---|---|---:|---:|---:|---|---|",
    ]
    for row in rows:
        med = row["median_calls_per_second"]
        lines.append(
            f"| {row['model']} ({_groups(row)}; {row['num_blocks']:,} blocks) | {_trace(row)} "
            f"| {med['vllm']:,.0f} | {med['pagedkv']:,.0f} "
            f"| {row['ratio_pagedkv_over_vllm']:.2f}x | {_per_run(row)} "
            f"| {'yes' if row['identical'] else 'no'} |"
        )
    return "\n".join(lines)


def _median_seconds(runs: list[dict[str, Any]], kind: str) -> float:
    return statistics.median(run["manager_seconds_by_kind"][kind] for run in runs)


def kind_table(rows: list[dict[str, Any]]) -> str:
    """Per kind of call, vLLM's median seconds over pagedkv's."""
    head = " | ".join(label for _, label in KINDS)
    lines = [f"| layout | trace | {head} |", "|---|---|" + "---:|" * len(KINDS)]
    for row in rows:
        cells = []
        for kind, _ in KINDS:
            vllm = _median_seconds(row["runs"]["vllm"], kind)
            pagedkv = _median_seconds(row["runs"]["pagedkv"], kind)
            cells.append(f"{vllm / pagedkv:.1f}x" if pagedkv else "-")
        lines.append(f"| {row['layout']} | {_trace(row)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("json_file", type=Path)
    args = ap.parse_args(argv)
    result = msgspec.json.decode(args.json_file.read_bytes())
    rows = result["rows"]
    print(ratio_table(rows))
    print()
    print("vLLM's seconds over pagedkv's, per kind of call (medians of the runs):")
    print()
    print(kind_table(rows))
    summary = result.get("summary")
    if summary:
        print()
        print(
            f"{summary['rows']} rows: ratio geometric mean {summary['ratio_geomean']:.2f}, "
            f"min {summary['ratio_min']:.2f}, max {summary['ratio_max']:.2f}; identical "
            f"{summary['identical_rows']} of {summary['rows']}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
