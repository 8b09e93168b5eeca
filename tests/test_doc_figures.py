"""The printed output shown in README.md and the docs is what its command prints today:
`COLUMNS=100 pagedkv plan` (README.md, docs/models.md) and `pagedkv simulate --bound`
(README.md, docs/simulation.md), every row but the two timings. Rows are compared cell by
cell, without the padding: a timing's width sets the table's, and it differs from machine
to machine."""

from __future__ import annotations

import os
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TIMED_ROWS = ("│ manager time ", "│ wall time ")


def _shown_output(doc: str, first_line: str) -> list[str]:
    """The lines of the one fenced block of ``doc`` from its line that starts with
    ``first_line`` on (a ``$ command`` line before it is skipped)."""
    found = []
    for block in (ROOT / doc).read_text().split("```")[1::2]:
        lines = [line.rstrip() for line in block.splitlines()]
        starts = [i for i, line in enumerate(lines) if line.strip().startswith(first_line)]
        found += [lines[i:] for i in starts]
    assert len(found) == 1, f"{doc}: expected one block showing {first_line!r}"
    return found[0]


@cache
def _printed(*argv: str) -> list[str]:
    result = subprocess.run(
        [sys.executable, "-m", "pagedkv", *argv],
        env={**os.environ, "COLUMNS": "100"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return [line.rstrip() for line in result.stdout.splitlines()]


_RULE_CHARS = set("┌┐└┘├┤┬┴┼─━┏┓┗┛┡┩╇┃ ")


def _cells(line: str) -> str:
    """A table line without its padding: a rule as its corners and joints, a row as its
    stripped cells, any other line (the title) stripped."""
    text = line.strip()
    if text and set(text) <= _RULE_CHARS:
        return "".join(ch for ch in text if ch not in "─━ ")
    if "│" in text:
        return "|".join(cell.strip() for cell in text.split("│"))
    return text


def _untimed(lines: list[str]) -> list[str]:
    return [_cells(line) for line in lines if not line.lstrip().startswith(TIMED_ROWS)]


def test_timings_do_not_set_what_is_compared() -> None:
    fast = ["┌──────┬───────┐", "│ steps │  12 │", "│ wall time │ 1.0 s │", "└──────┴───────┘"]
    slow = ["┌────────┬──────────┐", "│ steps   │     12 │", "│ wall time │ 100.0 s │"]
    slow.append("└────────┴──────────┘")
    assert _untimed(fast) == _untimed(slow) == ["┌┬┐", "|steps|12|", "└┴┘"]


@pytest.mark.parametrize("doc", ["README.md", "docs/models.md"])
@pytest.mark.slow
def test_default_plan_output_is_todays(doc: str) -> None:
    assert _shown_output(doc, "gemma-3-27b-it on H100-80GB") == _printed("plan")


@pytest.mark.heavy
@pytest.mark.slow
def test_default_simulate_output_is_todays() -> None:
    # One test for both documents: the whole-trace run happens once, whatever worker
    # pytest-xdist gives each test.
    printed = _printed("simulate", "--bound")
    for doc in ("README.md", "docs/simulation.md"):
        shown = _shown_output(doc, "Llama-3.1-8B on mooncake_conversation")
        assert len(shown) == len(printed), doc
        assert _untimed(shown) == _untimed(printed), doc
