"""`pagedkv plan ORG/NAME` and `simulate ORG/NAME` from a local Hub cache (no network)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from models.hub_cache import add_repo, offline_cache
from pagedkv.cli.app import main
from pagedkv.models import load_model_config

pytest.importorskip("huggingface_hub")


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = offline_cache(tmp_path, monkeypatch)
    llama = load_model_config("Llama-3.1-8B").raw
    add_repo(cache, "meta-llama/Llama-3.1-8B", {"config.json": llama})
    add_repo(cache, "meta-llama/Llama-3.1-8B", {"config.json": {**llama, "num_hidden_layers": 8}},
             commit="e" * 40, ref="small")  # fmt: skip
    return cache


def test_plan_a_hub_id(cache: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(["plan", "meta-llama/Llama-3.1-8B", "--kv-cache-memory-bytes", "40GiB", "--json"]) == 0
    )
    hub = json.loads(capsys.readouterr().out)
    assert main(["plan", "Llama-3.1-8B", "--kv-cache-memory-bytes", "40GiB", "--json"]) == 0
    bundled = json.loads(capsys.readouterr().out)
    assert hub["model"] == "meta-llama/Llama-3.1-8B"
    assert hub["num_blocks"] == bundled["num_blocks"] == 20480


def test_revision_reaches_the_plan(cache: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["plan", "meta-llama/Llama-3.1-8B", "--kv-cache-memory-bytes", "40GiB", "--json"]
    assert main([*args, "--revision", "small"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["layer_kinds"] == {"full_attention": 8}


def test_simulate_a_hub_id(cache: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["simulate", "meta-llama/Llama-3.1-8B", "--revision", "small", "--num-blocks", "300"]
    assert main([*args, "--trace", "synthetic:5:1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["model"] == "meta-llama/Llama-3.1-8B" and out["num_blocks"] == 300


def test_missing_from_the_offline_cache(cache: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "Qwen/Qwen3-8B"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "HF_HUB_OFFLINE is set" in err


@pytest.mark.slow
def test_no_network_in_a_real_process_is_one_line(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if "PROXY" not in k.upper()}
    env |= {"HF_HUB_CACHE": str(tmp_path), "HF_ENDPOINT": "http://hub.invalid"}
    env.pop("HF_HUB_OFFLINE", None)
    proc = subprocess.run(
        [sys.executable, "-m", "pagedkv", "plan", "acme/model"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,  # a hang guard, not a speed check
    )
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and "cannot reach the Hugging Face Hub" in proc.stderr
