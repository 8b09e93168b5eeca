"""pagedkv's scheduler makes vLLM 0.33's schedule: ``benchmarks/sched_side_by_side.py`` on
a slice of the bundled Mooncake trace, a full-attention and a hybrid model, vLLM's default
FCFS, priority scheduling and the long-prefill threshold, compared step by step against
vLLM's own ``Scheduler``. Needs the vLLM peer venv (skipped without it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "sched_side_by_side.py"
VENV = Path(os.environ.get("PEER_VENV", "/tmp/vllm-peer-venv"))
PEER_DIRS = [up / "shared" / "tools" / "vllm_peer" for up in ROOT.parents[:2]]


@pytest.mark.heavy
@pytest.mark.slow
@pytest.mark.skipif(
    not (VENV / "bin" / "python").exists() or not any(p.is_dir() for p in PEER_DIRS),
    reason="needs the vLLM peer venv and ../shared/tools/vllm_peer",
)
def test_schedules_are_vllms_step_by_step() -> None:
    # 16,000 blocks: vLLM requires room for one max_model_len (131,072-token) request
    args = ["--model", "llama", "--model", "gemma", "--num-blocks", "16000", "--limit", "40"]
    for variant in ("fcfs", "priority", "long-prefill-adaptive"):
        args += ["--variant", variant]
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), *args, "--json"],
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    assert proc.stdout, proc.stderr[-3000:]
    runs = json.loads(proc.stdout)
    assert len(runs) == 6
    for run in runs:
        assert run["identical"], json.dumps(run, indent=1)
        assert run["steps_compared"] > 100 and run["vllm"]["requests_finished"] == 40
    assert proc.returncode == 0
