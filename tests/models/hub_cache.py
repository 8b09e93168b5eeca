"""A Hugging Face Hub cache on disk, as huggingface_hub lays it out, for offline tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def add_repo(
    cache: Path,
    repo_id: str,
    files: dict[str, Any],
    *,
    commit: str = COMMIT,
    ref: str = "main",
) -> Path:
    """Write ``files`` (name -> JSON-able object) as ``repo_id``'s snapshot at ``commit``."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        (snapshot / name).write_text(json.dumps(content))
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / ref).write_text(commit)
    return snapshot


def offline_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty Hub cache that huggingface_hub must use, with the network switched off."""
    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("PAGEDKV_TRANSFORMERS", "0")
    return cache
