"""benchmarks/README.md indexes benchmarks/results/: one table row per result file and no
row for a file that is not there; every benchmarks/ script or result its commands name
exists; its script list names exactly the scripts in benchmarks/."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"
RESULTS = BENCHMARKS / "results"
README = BENCHMARKS / "README.md"

# benchmarks/NAME or benchmarks/results/NAME, not the tail of another path ($SHARED/...)
BENCHMARK_PATH = re.compile(r"(?<![\w$/.-])benchmarks/((?:results/)?[\w.-]+)")


def _section(title: str) -> list[str]:
    lines = README.read_text().splitlines()
    start = lines.index(f"## {title}") + 1
    end = next((i for i in range(start, len(lines)) if lines[i].startswith("## ")), len(lines))
    return lines[start:end]


def _table() -> list[tuple[str, str]]:
    """(file, command) of every row of the result files' table."""
    rows = []
    for line in _section("Result files"):
        if not line.startswith("|") or line.startswith(("| file |", "|---")):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        assert len(cells) == 4, f"not a 4-cell row (a '|' inside a cell?): {line}"
        name = re.fullmatch(r"`([^`/]+)`", cells[0])
        assert name, f"first cell is not one `file name`: {line}"
        rows.append((name.group(1), cells[2]))
    assert rows, "benchmarks/README.md has no result files' table"
    return rows


def test_every_result_file_has_one_row() -> None:
    listed = [name for name, _ in _table()]
    present = {p.name for p in RESULTS.iterdir() if p.is_file() and not p.name.startswith(".")}
    duplicates = sorted({n for n in listed if listed.count(n) > 1})
    assert not duplicates, f"listed twice in benchmarks/README.md: {duplicates}"
    assert not present - set(listed), (
        f"not in benchmarks/README.md: {sorted(present - set(listed))}"
    )
    assert not set(listed) - present, f"listed but not in results/: {sorted(set(listed) - present)}"


def test_commands_name_existing_scripts() -> None:
    missing = []
    for name, command in _table():
        paths = BENCHMARK_PATH.findall(command)
        missing += [f"{name}: benchmarks/{p}" for p in paths if not (BENCHMARKS / p).is_file()]
    assert not missing, f"commands name files that do not exist: {missing}"


def test_script_list_matches_scripts() -> None:
    listed = [m.group(1) for line in _section("Scripts") if (m := re.match(r"- `(\w+\.py)`", line))]
    present = {p.name for p in BENCHMARKS.glob("*.py")}
    assert sorted(listed) == sorted(present), (
        f"missing: {sorted(present - set(listed))}, gone: {sorted(set(listed) - present)}"
    )
