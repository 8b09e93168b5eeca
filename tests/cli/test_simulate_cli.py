"""`pagedkv simulate` end to end, in a subprocess, parsing --json."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ENV = {**os.environ, "PAGEDKV_TRANSFORMERS": "0"}
BASE = ["simulate", "Llama-3.1-8B", "--num-blocks", "400", "--json"]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pagedkv.cli", *args],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=120,
    )


@pytest.mark.slow
def test_json_summary_with_bound_on_a_synthetic_trace(tmp_path):
    steps = tmp_path / "steps.csv"
    proc = _run(*BASE, "--trace", "synthetic:40:1", "--bound", "--steps-csv", str(steps))
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    for key in ("requests", "prompt_tokens", "hit_tokens", "hit_rate", "preemptions"):
        assert key in data
    assert data["requests"] == 40 and data["num_blocks"] == 400
    assert data["manager_calls"] == sum(data["manager_calls_by_kind"].values()) > 0
    assert data["manager_seconds"] > 0 and 0 < data["peak_usage"] <= 1
    assert isinstance(data["evictions"], int)
    assert data["hit_tokens"] > 0  # the synthetic trace shares system prompts
    assert data["hit_rate"] == pytest.approx(data["hit_tokens"] / data["prompt_tokens"], 1e-5)
    assert data["bound_hit_rate"] >= data["hit_rate"]
    lines = steps.read_text().splitlines()
    assert lines[0].startswith("step,time_s,running") and len(lines) == data["steps"] + 1


@pytest.mark.slow
def test_malformed_trace_line_is_an_error_or_skipped(tmp_path):
    trace = tmp_path / "t.jsonl"
    good = json.dumps({"timestamp": 0, "input_length": 40, "output_length": 3, "hash_ids": [1]})
    trace.write_text(f"{good}\n{{broken\n{good}\n")
    proc = _run(*BASE, "--trace", str(trace))
    assert proc.returncode != 0
    assert "t.jsonl: line 2" in proc.stderr
    proc = _run(*BASE, "--trace", str(trace), "--skip-bad-lines")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["skipped_lines"] == 1 and data["requests"] == 2
    # the same 40 tokens twice, admitted in one step: the first caches its 2 full blocks
    # when allocated, so the second hits 32 tokens (at most 39 may hit)
    assert data["hit_tokens"] == 32


@pytest.mark.slow
def test_sweep_json_and_plot(tmp_path):
    pytest.importorskip("matplotlib")
    png = tmp_path / "sweep.png"
    proc = _run(*BASE, "--trace", "synthetic:30:2", "--sweep", "--plot", str(png))
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)["sweep"]
    assert [r["num_blocks"] for r in rows] == [50, 100, 200, 400, 800, 1600]
    assert all(r["bound_hit_rate"] >= r["hit_rate"] for r in rows)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_bad_options_are_one_line_errors():
    proc = _run(*BASE, "--arrivals", "never")
    assert proc.returncode != 0 and "--arrivals" in proc.stderr
    proc = _run(*BASE, "--trace", "no-such-trace")
    assert proc.returncode != 0 and "no-such-trace" in proc.stderr
    proc = _run(*BASE, "--gpu", "H100-80GB")
    assert proc.returncode != 0 and "--gpu and --num-blocks are alternatives" in proc.stderr
    proc = _run(*BASE, "--plot", "x.png")
    assert proc.returncode != 0 and "add --sweep" in proc.stderr
    proc = _run(*BASE, "--retention", "sometimes")
    assert proc.returncode != 0 and "--retention must be 'vllm' or 'dense'" in proc.stderr


@pytest.mark.slow
def test_retention_choice_reaches_the_manager():
    proc = _run(*BASE, "--trace", "synthetic:5:1", "--retention", "dense")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["retention"] == "dense"


@pytest.mark.slow
def test_a_retention_a_plugin_adds_is_selectable():
    code = (
        "import sys; from pagedkv import config; from pagedkv.cli import main; "
        "config.PREFIX_CACHE_RETENTIONS['dense-again'] = config.PREFIX_CACHE_RETENTIONS['dense']; "
        "main()"
    )
    args = [*BASE, "--trace", "synthetic:5:1", "--retention", "dense-again"]
    proc = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, env=ENV, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["retention"] == "dense-again"


@pytest.mark.slow
def test_human_summary_and_sweep_tables():
    args = ("simulate", "Llama-3.1-8B", "--num-blocks", "300", "--trace", "synthetic:20:1")
    proc = _run(*args, "--bound")
    assert proc.returncode == 0, proc.stderr
    assert "hit rate (tokens)" in proc.stdout and "best possible hit rate (bound)" in proc.stdout
    assert "300 x 16 tokens" in proc.stdout
    proc = _run(*args, "--sweep")
    assert proc.returncode == 0, proc.stderr
    assert "LRU hit rate" in proc.stdout and "2,400" in proc.stdout  # 150 blocks x 16 tokens


@pytest.mark.slow
def test_defaults_with_bound_and_a_planned_sweep():
    # no model, trace or size: Llama-3.1-8B, Mooncake, the H100-80GB plan
    # (vllm serve's 1024 seqs and 8192 tokens in the activation reserve, as `pagedkv plan`:
    # 27,432 blocks)
    proc = _run("simulate", "--limit", "3", "--bound", "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert (data["model"], data["trace"]) == ("Llama-3.1-8B", "mooncake_conversation")
    assert data["num_blocks"] == 27432 and data["requests_done"] == 3
    assert data["bound_hit_rate"] >= data["hit_rate"]
    proc = _run("simulate", "--limit", "3", "--sweep", "--json")
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)["sweep"]
    assert [r["num_blocks"] for r in rows] == [3429, 6858, 13716, 27432, 54864, 109728]


@pytest.mark.slow
def test_num_blocks_too_small_for_an_explicit_max_model_len_is_a_one_line_error():
    proc = _run(*BASE, "--max-model-len", "32768")
    assert proc.returncode != 0
    assert "400 KV cache blocks" in proc.stderr and "largest max_model_len" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_gpu_sizes_the_cache_as_plan_does():
    shared = ("Llama-3.1-8B", "--gpu", "A100-40GB", "--tp", "2", "--block-size", "32", "--json")
    # The same scheduler limits: they size the activation reserve in both.
    shared += ("--max-num-seqs", "64", "--max-num-batched-tokens", "8192")
    proc = _run("simulate", *shared, "--trace", "synthetic:3:1")
    assert proc.returncode == 0, proc.stderr
    simulated = json.loads(proc.stdout)
    proc = _run("plan", *shared)
    assert proc.returncode == 0, proc.stderr
    planned = json.loads(proc.stdout)
    assert planned["tensor_parallel_size"] == 2 and planned["block_size"] == 32
    assert simulated["block_size"] == 32
    assert simulated["num_blocks"] == planned["num_blocks"] > 0
