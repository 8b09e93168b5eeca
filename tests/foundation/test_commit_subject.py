"""The commit-msg hook: subjects within 72 characters, a blank line before the body."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

HOOK = Path(__file__).resolve().parents[2] / ".githooks" / "commit_subject.py"


def _run(tmp_path: Path, message: str) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "COMMIT_EDITMSG"
    path.write_text(message, encoding="utf-8")
    return subprocess.run(
        [sys.executable, str(HOOK), str(path)], capture_output=True, text=True, check=False
    )


@pytest.mark.parametrize(
    "message",
    [
        "runtime: skip floors\n\n" + "A long body line is fine. " * 5 + "\n",
        "x" * 72 + "\n",
        "short\n# a comment git strips\n",
    ],
)
def test_a_short_subject_passes(tmp_path: Path, message: str) -> None:
    assert _run(tmp_path, message).returncode == 0


def test_a_long_subject_is_refused_with_its_length(tmp_path: Path) -> None:
    result = _run(tmp_path, "x" * 73 + "\n")
    assert result.returncode == 1
    assert "73 characters" in result.stderr


def test_a_body_glued_to_the_subject_is_refused(tmp_path: Path) -> None:
    result = _run(tmp_path, "subject\nbody right under it\n")
    assert result.returncode == 1
    assert "blank line" in result.stderr
