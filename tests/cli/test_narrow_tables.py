"""At 80 columns and piped (no terminal), no figure of `pagedkv plan` breaks across
lines: every count the JSON reports appears whole in the tables, and no line is wider
than 80 columns."""

from __future__ import annotations

import contextlib
import io
import json

import pytest

from pagedkv.cli.app import main

LINES = [
    ["gemma-3-27b-it", "--grouping", "least-waste"],
    ["Qwen3.5-35B-A3B", "-tp", "4", "-pp", "2"],
    ["DeepSeek-V3", "-tp", "8", "--gpu", "H200"],
    ["Nemotron-H-56B-Base-8K", "--gpu", "A100-40GB", "-pp", "4"],
    ["gpt-oss-20b", "--context-len", "3000"],
]


def _run(argv: list[str]) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(argv) in (0, None)
    return out.getvalue()


@pytest.mark.parametrize("argv", LINES, ids=lambda a: a[0])
def test_figures_stay_whole_at_80_columns_when_piped(
    argv: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    text = _run(["plan", *argv])
    data = json.loads(_run(["plan", *argv, "--json"]))
    assert max(len(line) for line in text.splitlines()) <= 80
    figures = [f"{data['num_blocks']:,}", f"{data['max_model_len']:,}"]
    for point in data["concurrency_by_context_len"]:
        figures += [f"{point['context_len']:,}", f"{point['blocks_per_request']:,}"]
        if point["token_capacity"] is not None:
            figures.append(f"{point['token_capacity']:,}")
    for group in data["groups"]:
        figures += [f"{group['page_size_bytes']:,}", f"{group['blocks_per_request']:,}"]
    flat = [line for line in text.splitlines()]
    for figure in figures:
        assert any(figure in line for line in flat), f"{figure} is broken or missing"
