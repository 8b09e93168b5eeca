"""``pagedkv simulate`` runs as vLLM would serve the trace, and fails before a replay on
input it cannot finish with."""

from __future__ import annotations

import json
import shutil

import pytest

from pagedkv.cli.app import main
from pagedkv.models import load_model_config

SIM = ["simulate", "Llama-3.1-8B", "--num-blocks", "3000"]


def _json(capsys: pytest.CaptureFixture[str], args: list[str]) -> dict:
    assert main([*args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.slow
def test_the_whole_trace_is_replayed_with_arrival_times_by_default(capsys):
    data = _json(capsys, [*SIM, "--trace", "synthetic:1100:3"])
    assert data["requests"] == 1100 and data["trace_requests"] == 1100  # no 1,000 cut
    settings = data["settings"]
    assert settings["arrivals"] == "timestamp"
    assert settings["max_prefill_chunk"] is None and settings["long_prefill_token_threshold"] == 0
    # vllm serve on the default GPU (an H100: >= 70 GiB, not an A100)
    assert (settings["max_num_seqs"], settings["max_num_batched_tokens"]) == (1024, 8192)


def test_a_limit_says_how_much_of_the_trace_was_replayed(capsys):
    assert main([*SIM, "--trace", "synthetic:40:3", "--limit", "10"]) == 0
    assert "10 of 40 requests" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("gpu", "expected"),
    [("H200", (1024, 8192)), ("B200", (1024, 16384)), ("A100-80GB", (256, 2048))],
)
def test_scheduler_limits_are_vllm_serves_for_the_gpu(capsys, gpu, expected):
    data = _json(capsys, ["simulate", "--gpu", gpu, "--limit", "2"])
    got = data["settings"]
    assert (got["max_num_seqs"], got["max_num_batched_tokens"]) == expected


@pytest.mark.slow
def test_tier_options_with_a_local_model_directory(capsys, tmp_path):
    folder = tmp_path / "my-llama"
    source = load_model_config("Llama-3.1-8B").path
    assert source is not None
    shutil.copytree(source.parent, folder)
    args = ["simulate", str(folder), "--num-blocks", "400", "--trace", "synthetic:6:1"]
    data = _json(capsys, [*args, "--policy", "lfu", "--host-cache-gib", "1"])
    assert data["eviction_policy"] == "lfu" and data["mean_ttft_s"] > 0


def test_gpu_aliases_reach_the_cost_model(capsys):
    data = _json(capsys, ["simulate", "--gpu", "H200", "--limit", "3", "--policy", "s3fifo"])
    assert data["cost_model"]["prefill_tokens_per_s"] > 0


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("--pcie-gbps", "nan"),
        ("--pcie-gbps", "inf"),
        ("--host-cache-gib", "nan"),
        ("--host-cache-gib", "inf"),
        ("--host-cache-gib", "1e400"),
        ("--host-cache-gib", "-1"),
    ],
)
def test_non_finite_tier_sizes_are_refused(capsys, option, value):
    assert main([*SIM, "--limit", "3", option, value]) == 1
    err = capsys.readouterr().err
    assert "must be a finite number" in err and "Traceback" not in err


@pytest.mark.slow
def test_a_host_tier_too_large_is_refused_before_the_replay(capsys):
    # checked with the options: the whole trace is not replayed first
    assert main([*SIM, "--host-cache-gib", "1e6"]) == 1
    err = capsys.readouterr().err
    assert "more than the 16,777,216" in err and "give at most" in err
