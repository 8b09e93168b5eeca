"""vLLM 0.33's own KV cache tests against pagedkv.compat.vllm (../shared/tools/vllm_tests):
the number that pass must not fall below the count measured when this floor was set.
Skips when the shared tools are not beside the checkout. Writes the summary line where
.ci/run reprints it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# vLLM-suite count measured for this floor (docs/vllm-compat.md has the current one).
FLOOR = 685


def _suite_dir() -> Path | None:
    for base in (ROOT.parent, ROOT.parent.parent):
        tools = base / "shared" / "tools" / "vllm_tests"
        if (tools / "run.sh").is_file() and (tools / "vllm-0.33.0" / "tests").is_dir():
            return tools
    return None


SUITE = _suite_dir()


@pytest.mark.heavy
@pytest.mark.slow
@pytest.mark.skipif(SUITE is None, reason="../shared/tools/vllm_tests is not present")
def test_vllm_suite_count_does_not_fall_below_floor(tmp_path: Path) -> None:
    assert SUITE is not None
    out = Path(os.environ.get("TMPDIR", "/tmp")) / "pagedkv-vllm-suite"
    env = {
        **os.environ,
        "PAGEDKV_PY": sys.executable,
        "PYTHONPATH": str(ROOT / "src"),
        "OUT": str(out),
        "PAGEDKV_ROOT": str(ROOT),
    }
    run = subprocess.run(
        ["bash", str(SUITE / "run.sh")], env=env, capture_output=True, text=True, check=False
    )
    match = re.search(r"^vLLM-suite: (\d+) passed, (\d+) failed.*$", run.stdout, re.M)
    assert match, f"run.sh printed no vLLM-suite line:\n{run.stdout[-2000:]}\n{run.stderr[-2000:]}"
    (out / "summary.txt").write_text(match.group(0) + "\n")
    assert int(match.group(1)) >= FLOOR, match.group(0)
