"""Every bundled config.json is listed in data/SOURCES.md with its sha256, and the file
has exactly those bytes (a config edited after it was checked fails here)."""

from __future__ import annotations

import hashlib
from pathlib import Path

from pagedkv.models import list_bundled_models
from pagedkv.models.source import bundled_models_dir

SOURCES = bundled_models_dir().parent / "SOURCES.md"
STATUSES = {
    "published, hash-verified",
    "published copy, not hash-verified",
    "edited",
    "hand-written",
}


def _table() -> dict[str, tuple[str, str, int]]:
    rows: dict[str, tuple[str, str, int]] = {}
    section = SOURCES.read_text().split("## Model configs", 1)[1]
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 6 or cells[0] in ("name", "") or set(cells[0]) <= {"-"}:
            continue
        name, _repo, status, sha256, size = cells[:5]
        rows[name] = (status, sha256, int(size))
    return rows


def test_every_bundled_config_has_the_hash_its_sources_row_states() -> None:
    table = _table()
    assert sorted(table, key=str.lower) == list_bundled_models()
    for name, (status, sha256, size) in table.items():
        data = Path(bundled_models_dir() / name / "config.json").read_bytes()
        assert status in STATUSES, name
        assert (hashlib.sha256(data).hexdigest(), len(data)) == (sha256, size), name


def test_the_published_gemma_3_27b_it_is_bundled() -> None:
    status, _, _ = _table()["gemma-3-27b-it"]
    assert status == "published, hash-verified"
