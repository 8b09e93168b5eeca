"""The docs still match the code: README.md's and docs/*.md's Python examples import
names that exist and run (fragments that need names from the surrounding prose stop at
the first such name), and docs/ARCHITECTURE.md's layer table allows exactly the imports
tests/test_architecture.py enforces.

docs/engine-integration.md runs as one program in tests/tensors/test_docs.py and
tests/hf/test_docs.py (torch), so it is left out of the per-block run here.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RUN_ELSEWHERE = {"engine-integration.md"}


def python_blocks() -> list[tuple[str, str]]:
    """(file:line, code) of every ```python / ```py block."""
    blocks = []
    for path in DOCS:
        text = path.read_text()
        for m in re.finditer(r"^```(?:python|py)\n(.*?)^```", text, flags=re.S | re.M):
            line = text[: m.start()].count("\n") + 1
            blocks.append((f"{path.relative_to(ROOT)}:{line}", m.group(1)))
    return blocks


BLOCKS = python_blocks()


def _missing_optional(exc: ImportError) -> bool:
    return bool(exc.name) and not str(exc.name).startswith("pagedkv")


@pytest.mark.parametrize(("where", "code"), BLOCKS, ids=[w for w, _ in BLOCKS])
def test_doc_example_imports_exist(where: str, code: str) -> None:
    missing = []
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("pagedkv"):
            module_name, names = str(node.module), [a.name for a in node.names]
        elif isinstance(node, ast.Import):
            module_name, names = "", [a.name for a in node.names if a.name.startswith("pagedkv")]
        else:
            continue
        for name in names:
            target = f"{module_name}.{name}" if module_name else name
            try:
                if module_name:
                    module = importlib.import_module(module_name)
                    if hasattr(module, name):
                        continue
                importlib.import_module(target)
            except ImportError as exc:
                if _missing_optional(exc):
                    continue
                missing.append(f"{target} ({exc})")
    assert not missing, f"{where}: names the code no longer has: {missing}"


RUNNABLE = [(w, c) for w, c in BLOCKS if Path(w.split(":")[0]).name not in RUN_ELSEWHERE]


@pytest.mark.parametrize(("where", "code"), RUNNABLE, ids=[w for w, _ in RUNNABLE])
@pytest.mark.slow
def test_doc_example_runs(where: str, code: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300
    )
    if proc.returncode == 0:
        return
    last = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else ""
    if last.startswith("NameError"):
        return  # a fragment: it uses names the prose around it defines
    if last.startswith("ModuleNotFoundError") and "pagedkv" not in last:
        pytest.skip(f"{where}: an optional dependency is missing ({last})")
    pytest.fail(f"{where} fails:\n{proc.stderr[-2000:]}")


def _allowed_by_the_test() -> tuple[dict[str, frozenset[str]], frozenset[str]]:
    spec = importlib.util.spec_from_file_location(
        "_architecture_table", ROOT / "tests" / "test_architecture.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return dict(module.ALLOWED), frozenset(module.BOTTOM)


def _allowed_by_the_doc(bottom: frozenset[str]) -> dict[str, frozenset[str]]:
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    table = text[text.index("| layer | path | holds | may import |") :].split("\n\n")[0]
    rows = [r for r in table.splitlines()[2:] if r.startswith("|")]
    allowed: dict[str, frozenset[str]] = {}
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        layer = re.findall(r"`([^`]+)`", cells[0])[0]
        # parenthesised notes name the allow-listed upward imports, not the table's
        may_import = re.sub(r"\([^)]*\)", "", cells[3])
        names = set(re.findall(r"`([^`]+)`", may_import))
        if re.search(r"\bbottom\b", may_import):
            names |= bottom
        allowed[layer] = frozenset(names)
    return allowed


def test_architecture_doc_layer_table_matches_the_test() -> None:
    table, bottom = _allowed_by_the_test()
    documented = _allowed_by_the_doc(bottom)
    # a layer's own modules (planning's planning.types) are always allowed; _version is
    # the bottom's generated version string, not a layer a reader needs.
    enforced = {
        layer: frozenset(n for n in names if n.split(".")[0] != layer)
        for layer, names in table.items()
        if layer != "_version"
    }
    assert sorted(documented) == sorted(enforced), "layers differ"
    wrong = {
        layer: {
            "doc only": sorted(documented[layer] - names),
            "test only": sorted(names - documented[layer]),
        }
        for layer, names in enforced.items()
        if documented[layer] != names
    }
    assert not wrong, wrong
