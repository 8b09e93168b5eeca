"""The real ``pagedkv plan`` command in a subprocess, checked against the planner."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pagedkv.cli.app import main
from pagedkv.cli.plan import DEFAULT_GPU, DEFAULT_MODEL
from pagedkv.models import (
    describe_model,
    engine_config_for,
    get_gpu,
    get_kv_cache_specs,
    memory_budgets,
)
from pagedkv.planning import plan_kv_cache

FAST_ENV = {**os.environ, "PAGEDKV_TRANSFORMERS": "0", "COLUMNS": "120"}


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pagedkv.cli", *args],
        capture_output=True,
        text=True,
        env=env or FAST_ENV,
        timeout=120,
    )


def run_json(*args: str) -> dict[str, Any]:
    proc = run(*args, "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.mark.slow
def test_plan_json_matches_the_planner() -> None:
    out = run_json("plan", "Llama-3.1-8B", "--gpu", "H100-80GB", "--max-model-len", "32768")
    layout = describe_model("Llama-3.1-8B", use_transformers=False)
    # vllm serve's defaults on a >= 70 GiB GPU other than an A100.
    config = engine_config_for(
        layout, max_model_len=32768, max_num_seqs=1024, max_num_batched_tokens=8192
    )
    budgets = memory_budgets(
        layout, config, device_bytes=get_gpu("H100-80GB").planning_memory_bytes
    )
    specs = get_kv_cache_specs(layout, config=config)
    plan = plan_kv_cache(config, specs, [b.kv_cache_bytes for b in budgets])
    assert out["model"] == "Llama-3.1-8B" and out["gpu"] == "H100-80GB"
    for key in ("block_size", "num_blocks", "bytes_per_block", "max_model_len", "waste_fraction"):
        assert out[key] == getattr(plan, key), key
    assert out["bytes_per_block"] == 32 * 65536  # 32 layers x 64 KiB (reference 8.1)
    (group,) = out["groups"]
    assert group["kind"] == "full_attention" and len(group["layers"]) == 32
    assert (group["block_size"], group["page_size_bytes"]) == (16, 2 * 2**20)
    memory = out["memory"]
    assert memory["device_bytes"] == get_gpu("H100-80GB").planning_memory_bytes
    assert (
        memory["kv_cache_bytes"]
        == budgets[0].kv_cache_bytes
        == (memory["usable_bytes"] - memory["weight_bytes"] - memory["activation_bytes"])
    )
    at_max = out["concurrency_by_context_len"][0]
    assert at_max["context_len"] == 32768
    assert at_max["max_concurrency"] == plan.max_concurrency[0].max_concurrency
    assert out["max_concurrency"] == plan.max_concurrency[0].vllm_max_concurrency
    assert out["schema_version"] == 3
    assert (out["max_num_seqs"], out["max_num_batched_tokens"]) == (1024, 8192)
    table = out["concurrency_by_context_len"]
    assert {p["context_len"] for p in table} == {1024, 4096, 16384, 32768}
    # The largest length that fits comes from the planner's auto-fit, capped at the model's limit.
    available = [b.kv_cache_bytes for b in budgets]
    auto = config.replace(max_model_len=-1)
    fitted = plan_kv_cache(auto, specs, available, max_model_len_limit=131072)
    assert out["largest_max_model_len"] == fitted.max_model_len


@pytest.mark.slow
def test_kv_cache_memory_skips_the_estimate() -> None:
    out = run_json("plan", "Llama-3.1-8B", "--kv-cache-memory", "40GiB", "--context-len", "2048")
    # Reference 8.1: 40 GiB / 2 MiB = 20,480 blocks; 8,192 per 131,072-token request.
    assert out["num_blocks"] == 20480
    assert out["memory"]["given"] is True and out["memory"]["kv_cache_bytes"] == 40 * 2**30
    point = out["concurrency_by_context_len"][0]
    assert point["blocks_per_request"] == 8192 and point["vllm_max_concurrency"] == 2.5
    assert out["max_concurrency"] == 2.5  # vLLM's "Maximum concurrency" line
    assert 2048 in {p["context_len"] for p in out["concurrency_by_context_len"]}


@pytest.mark.slow
def test_hybrid_mamba_plan_matches_reference_example() -> None:
    out = run_json("plan", "Jamba-v0.1", "--gpu", "H200", "--max-model-len", "262144")
    # Reference 8.3: attention block size bumped to 80 so a 4 KiB/token page covers
    # the 311,296 B Mamba state; 8 groups of 4 layers, 1.25 MiB per block.
    assert out["block_size"] == 80
    assert out["bytes_per_block"] == 1_310_720
    kinds = sorted(g["kind"] for g in out["groups"])
    assert kinds == ["full_attention"] + ["mamba"] * 7
    mamba = next(g for g in out["groups"] if g["kind"] == "mamba")
    assert mamba["padding_bytes"] == 4 * 16_384


@pytest.mark.slow
def test_tp_and_pp_reach_the_planner() -> None:
    out = run_json("plan", "DeepSeek-V3", "--gpu", "H200", "--tp", "8", "--pp", "2")
    assert (out["tensor_parallel_size"], out["pipeline_parallel_size"]) == (8, 2)
    assert out["kv_tp_replicas"] == 8  # MLA latents are replicated on every TP rank
    assert len(out["memory"]["per_worker"]) == 16
    assert out["groups"][0]["kind"] == "mla_attention"


@pytest.mark.slow
def test_default_plan_is_readable() -> None:
    proc = run("plan", env={**os.environ, "COLUMNS": "120"})  # transformers path if installed
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    assert f"{DEFAULT_MODEL} on {DEFAULT_GPU}" in text
    for title in ("KV cache memory per worker", "KV cache groups", "Capacity"):
        assert title in text
    assert "Max concurrency by context length" in text
    assert "sliding_window" in text and "full_attention" in text


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["plan", "no-such-model"], "error: no-such-model: no such file or directory"),
        (["plan", "Llama-3.1-8B", "--tp", "3"], "is not divisible by tensor_parallel_size (3)"),
        (["plan", "Llama-3.1-8B", "--gpu", "H100", "--memory", "80GB"], "--gpu and --memory"),
        (["plan", "Llama-3.1-8B", "--memory", "lots"], "--memory: cannot read 'lots'"),
        (["plan", "Llama-3.1-8B", "--gpu", "V100"], "GPU 'V100' is not in the GPU table"),
        (["plan", "Llama-3.1-8B", "--memory", "24GB"], "the largest max_model_len that fits is"),
        (["plan", "Kimi-K2-Instruct", "--gpu", "L4"], "no memory left for the KV cache"),
        (["plan", "t5-small", "--pp", "9"], "pipeline_parallel_size (9) is larger"),
        (
            ["plan", "gemma-3-27b-it", "--max-groups", "1", "--grouping", "least-waste"],
            "max_kv_cache_groups=1 cannot be met",
        ),
        (["plan", "gemma-3-27b-it", "--max-groups", "8"], "kv_cache_grouping_rule='least-waste'"),
        (
            ["plan", "gemma-3-27b-it", "--grouping", "fewest"],
            "must be 'vllm' or 'least-waste'",
        ),
    ],
)
def test_bad_input_is_one_line(
    args: list[str],
    message: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PAGEDKV_TRANSFORMERS", "0")
    assert main(args) == 1
    out = capsys.readouterr()
    lines = out.err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], out.err
    assert "Traceback" not in out.err and out.out == ""


@pytest.mark.slow
def test_bad_input_in_a_real_process() -> None:
    proc = run("plan", "no-such-model")
    assert proc.returncode == 1
    assert proc.stderr.startswith("error: no-such-model:") and proc.stderr.count("\n") == 1
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
def test_usage_error_exit_code() -> None:
    proc = run("plan", "Llama-3.1-8B", "--tp", "0")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr


@pytest.mark.slow
def test_debug_shows_the_traceback() -> None:
    proc = run("plan", "Llama-3.1-8B", "--tp", "3", "--debug")
    assert proc.returncode != 0
    assert "Traceback" in proc.stderr and "ModelConfigError" in proc.stderr


@pytest.mark.slow
def test_plot_writes_a_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    path = tmp_path / "capacity.png"
    proc = run("plan", "gpt-oss-20b", "--gpu", "H100-80GB", "--plot", str(path))
    assert proc.returncode == 0, proc.stderr
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"plot written to {path}" in proc.stdout.replace("\n", "")


def plan_in_process(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    assert main(["plan", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_memory_and_cache_options(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PAGEDKV_TRANSFORMERS", "0")
    base = ["Llama-3.1-8B", "--memory", "80GiB", "--max-model-len", "8192"]
    plain = plan_in_process(capsys, *base)
    assert plain["memory"]["device_bytes"] == 80 * 2**30
    weights = plan_in_process(capsys, *base, "--weights", "10GiB")
    assert weights["memory"]["weight_bytes"] == 10 * 2**30
    assert weights["num_blocks"] > plain["num_blocks"]
    util = plan_in_process(capsys, *base, "--gpu-memory-utilization", "0.5")
    assert util["memory"]["usable_bytes"] == int(80 * 2**30 * 0.5)
    fp8 = plan_in_process(capsys, *base, "--kv-cache-dtype", "fp8")
    assert fp8["kv_cache_dtype"] == "fp8_e4m3"
    assert fp8["bytes_per_block"] * 2 == plain["bytes_per_block"]
    big = plan_in_process(capsys, *base, "--block-size", "32")
    assert (big["block_size"], big["bytes_per_block"]) == (32, 2 * plain["bytes_per_block"])
    auto = plan_in_process(capsys, "Llama-3.1-8B", "--memory", "24GB", "--max-model-len", "-1")
    assert auto["max_model_len_auto_fitted"] is True
    assert auto["max_model_len"] == auto["largest_max_model_len"] < 131072


def test_encoder_decoder_plan(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PAGEDKV_TRANSFORMERS", "0")
    out = plan_in_process(capsys, "whisper-large-v3", "--gpu", "L4")
    assert sorted(g["kind"] for g in out["groups"]) == ["cross_attention", "full_attention"]
    assert out["max_model_len"] == 448


def test_auto_fit_without_a_model_limit(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PAGEDKV_TRANSFORMERS", "0")
    # Pure Mamba: memory does not grow with length; the search stops at the default limit.
    out = plan_in_process(capsys, "mamba2-2.7b", "--gpu", "H200", "--max-model-len", "-1")
    assert out["max_model_len"] == out["largest_max_model_len"] == 8192
    assert [g["kind"] for g in out["groups"]] == ["mamba"]


def test_max_groups_bounds_the_hybrid_grouping(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PAGEDKV_TRANSFORMERS", "0")
    vllm = plan_in_process(capsys, "gemma-3-27b-it")
    assert (vllm["num_groups"], vllm["alternatives"]) == (7, [])  # vLLM's rule by default
    assert round(vllm["concurrency_by_context_len"][0]["bytes_per_request"] / 2**30, 2) == 14.23
    least_waste = ("gemma-3-27b-it", "--grouping", "least-waste")
    default = plan_in_process(capsys, *least_waste)
    assert default["num_groups"] == 13  # 52 sliding + 10 full layers, 5 per group
    excluded = [a for a in default["alternatives"] if not a["within_budget"]]
    assert [a["num_groups"] for a in excluded] == [31]
    assert {a["max_groups"] for a in default["alternatives"]} == {16}
    widest = plan_in_process(capsys, *least_waste, "--max-groups", "64")
    assert (widest["num_groups"], widest["waste_fraction"]) == (31, 0.0)
    assert all(a["within_budget"] for a in widest["alternatives"])
    narrow = plan_in_process(capsys, *least_waste, "--max-groups", "7")
    assert narrow["num_groups"] == 7
    per_request = [
        p["concurrency_by_context_len"][0]["bytes_per_request"] for p in (widest, default, narrow)
    ]
    assert per_request == sorted(per_request) and len(set(per_request)) == 3
    llama = plan_in_process(
        capsys, "Llama-3.1-8B", "--grouping", "least-waste", "--max-groups", "1"
    )
    assert llama["num_groups"] == 1


@pytest.mark.slow
def test_max_groups_must_be_positive() -> None:
    proc = run("plan", "gemma-3-27b-it", "--max-groups", "0")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr


def test_plot_curve_agrees_with_the_plan_it_draws() -> None:
    from itertools import pairwise

    from pagedkv.cli.plan import PlanOptions, make_plan
    from pagedkv.cli.plan_render import PLOT_POINTS, concurrency_curve

    result = make_plan(PlanOptions(model="gpt-oss-20b", gpu="H100-80GB", max_model_len=32768))
    curve = dict(concurrency_curve(result))
    assert 8 <= len(curve) <= PLOT_POINTS
    assert max(curve) == result.kv_cache.max_model_len == 32768
    point = result.kv_cache.concurrency_at(32768)
    assert curve[32768] == pytest.approx(point.max_concurrency)
    lengths = sorted(curve)
    assert all(curve[a] >= curve[b] for a, b in pairwise(lengths))


def test_groups_table_waste_share_is_the_planners(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # gemma-3-27b-it on H200: one sliding group leaves layer slots of a block id empty, so
    # waste over the group's own page (25%) differs from the planner's waste over a block id
    monkeypatch.setenv("PAGEDKV_TRANSFORMERS", "0")
    monkeypatch.setenv("COLUMNS", "120")
    data = plan_in_process(capsys, "gemma-3-27b-it", "--gpu", "H200")
    assert main(["plan", "gemma-3-27b-it", "--gpu", "H200"]) == 0
    text = capsys.readouterr().out
    assert any(0 < g["page_size_bytes"] < data["bytes_per_block"] for g in data["groups"])
    for g in data["groups"]:
        if g["waste_bytes"]:
            # the share sits on the cell's second line, under the bytes
            lines = text.splitlines()
            row = next(i for i, line in enumerate(lines) if f" {g['waste_bytes']:,} │" in line)
            assert f"({g['waste_fraction']:.1%})" in lines[row + 1]


@pytest.mark.slow
def test_plot_plans_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the curve comes from the table's own planning pass, not from planning again
    pytest.importorskip("matplotlib")
    import pagedkv.capacity.plan as capacity_plan

    passes: list[int] = []
    real = capacity_plan.plan_kv_cache_configs

    def counted(*args: Any, **kwargs: Any) -> Any:
        passes.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(capacity_plan, "plan_kv_cache_configs", counted)
    out = tmp_path / "curve.png"
    assert main(["plan", "gpt-oss-20b", "--gpu", "H100-80GB", "--plot", str(out)]) == 0
    assert out.stat().st_size > 0 and len(passes) == 1
