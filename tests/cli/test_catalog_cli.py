"""``pagedkv models`` / ``pagedkv gpus`` and the shared CLI helpers."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pagedkv.cli.app import main
from pagedkv.cli.common import format_bytes, parse_bytes
from pagedkv.errors import ConfigError
from pagedkv.models import list_bundled_models, list_gpus

ENV = {**os.environ, "PAGEDKV_TRANSFORMERS": "0"}


@pytest.mark.slow
def test_models_lists_every_bundled_model_with_kinds() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "pagedkv.cli", "models", "--json"],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    rows = {row["name"]: row for row in json.loads(proc.stdout)}
    assert list(rows) == list_bundled_models()
    assert rows["Jamba-v0.1"]["layer_kinds"] == {"full_attention": 4, "mamba": 28}
    assert rows["gemma-3-27b-it"]["layer_kinds"] == {"sliding_window": 52, "full_attention": 10}


def test_gpus_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["gpus", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in rows] == [g.name for g in list_gpus()]
    assert main(["gpus"]) == 0
    assert "H100-80GB" in capsys.readouterr().out


def test_no_command_shows_help(capsys: pytest.CaptureFixture[str]) -> None:
    code = main([])
    out = capsys.readouterr()
    assert code in (0, 2) and "plan" in out.out + out.err


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("80GiB", 80 * 2**30),
        ("80GB", 80 * 10**9),
        ("80 gb", 80 * 10**9),
        ("1.5e9", 1_500_000_000),
        ("85899345920", 85_899_345_920),
        ("512MiB", 512 * 2**20),
        ("2TB", 2 * 10**12),
    ],
)
def test_parse_bytes(text: str, expected: int) -> None:
    assert parse_bytes(text, "--memory") == expected


@pytest.mark.parametrize("text", ["", "lots", "80XB", "-1GB", "0", "GB"])
def test_parse_bytes_rejects(text: str) -> None:
    with pytest.raises(ConfigError, match="--memory"):
        parse_bytes(text, "--memory")


@settings(max_examples=50, deadline=None)
@given(st.integers(1, 2**50))
def test_format_then_parse_is_close(num_bytes: int) -> None:
    text = format_bytes(num_bytes).replace(" ", "")
    assert parse_bytes(text, "x") == pytest.approx(num_bytes, rel=0.01, abs=1)
