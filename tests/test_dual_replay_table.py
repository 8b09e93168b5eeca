"""benchmarks/dual_replay_table.py renders the side-by-side JSON it is given: one row per
layout and trace, the ratio of the medians, per-run ratios paired in run order and
per-kind seconds as vLLM's over pagedkv's."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType
from typing import Any

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "dual_replay_table.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("dual_replay_table", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(calls_per_second: float, seconds: dict[str, float]) -> dict[str, Any]:
    return {"manager_calls_per_second": calls_per_second, "manager_seconds_by_kind": seconds}


def _seconds(lookup: float, free: float) -> dict[str, float]:
    return {
        "get_computed_blocks": lookup,
        "allocate_slots_running": 1.0,
        "allocate_slots_admit": 1.0,
        "free": free,
    }


ROW = {
    "layout": "gemma",
    "model": "gemma-3-27b-like",
    "kv_cache_groups": ["SlidingWindowSpecx9", "SlidingWindowSpecx8", "FullAttentionSpecx10"],
    "num_blocks": 16384,
    "trace": "synthetic",
    "requests": 2000,
    "limit": None,
    "median_calls_per_second": {"vllm": 10_000.0, "pagedkv": 35_000.0},
    "ratio_pagedkv_over_vllm": 3.5,
    "identical": True,
    "runs": {
        "vllm": [_run(10_000, _seconds(4.0, 1.0)), _run(20_000, _seconds(6.0, 3.0))],
        "pagedkv": [_run(30_000, _seconds(1.0, 2.0)), _run(80_000, _seconds(1.0, 2.0))],
    },
}


def test_ratio_row_names_the_groups_and_pairs_runs_in_order() -> None:
    table = _load().ratio_table([ROW])
    row = table.splitlines()[2]
    assert "(2 SlidingWindow + 1 FullAttention; 16,384 blocks)" in row
    assert "| synthetic (2,000) | 10,000 | 35,000 | 3.50x | 3.00, 4.00 | yes |" in row


def test_kind_table_divides_median_seconds(tmp_path: Path, capsys: Any) -> None:
    module = _load()
    assert module.kind_table([ROW]).splitlines()[2] == (
        "| gemma | synthetic (2,000) | 5.0x | 1.0x | 1.0x | 1.0x |"
    )
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"rows": [ROW]}))
    assert module.main([str(path)]) == 0
    assert "vLLM's seconds over pagedkv's" in capsys.readouterr().out


def test_the_committed_results_render() -> None:
    results = SCRIPT.parent / "results" / "dual_replay.json"
    rows = json.loads(results.read_text())["rows"]
    table = _load().ratio_table(rows)
    assert len(table.splitlines()) == 2 + len(rows)
