"""docs/engine-integration.md runs as written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

DOC = Path(__file__).resolve().parents[2] / "docs" / "engine-integration.md"


def python_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)


def test_engine_integration_example_runs(capsys: pytest.CaptureFixture[str]) -> None:
    blocks = python_blocks(DOC.read_text())
    assert len(blocks) >= 4  # plan, allocate, manage, attend
    namespace: dict[str, object] = {"__name__": "engine_integration_doc"}
    for block in blocks:
        exec(compile(block, str(DOC), "exec"), namespace)
    out = capsys.readouterr().out
    assert "request b reuses" in out
    memory = namespace["memory"]
    assert any(torch.count_nonzero(v.tensor) for v in memory.layers.values())  # type: ignore[attr-defined]
