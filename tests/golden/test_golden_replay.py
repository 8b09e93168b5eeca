"""vLLM 0.33's own KVCacheManager, recorded (data/FORMAT.md), must be reproduced exactly:
every result and every state after every op. Recordings in ``$PAGEDKV_GOLDEN_DIR`` (every
``*.json.gz``) are replayed too."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pagedkv.runtime import BlockHasher, Request

from .replay import build_request, load, replay

DATA = Path(__file__).parent / "data"


def _recordings() -> list[Path]:
    paths = sorted(DATA.glob("*.json.gz"))
    extra = os.environ.get("PAGEDKV_GOLDEN_DIR")
    if extra:
        paths += sorted(Path(extra).glob("*.json.gz"))
    return paths


RECORDINGS = _recordings()


def test_the_shared_recordings_are_bundled() -> None:
    assert len(sorted(DATA.glob("*.json.gz"))) >= 12


@pytest.mark.parametrize("path", RECORDINGS, ids=[p.name for p in RECORDINGS])
def test_replay_matches_vllm_op_by_op(path: Path) -> None:
    assert replay(path) > 0


@pytest.mark.parametrize("path", RECORDINGS, ids=[p.name for p in RECORDINGS])
def test_block_hashes_equal_vllms(path: Path) -> None:
    data = load(path)
    layout = data["layout"]
    hasher = BlockHasher(layout["hash_block_size"], layout["hash_fn"], layout["none_hash_seed"])
    assert hasher.none_hash.hex() == layout["none_hash"]
    for rid, rec in data["requests"].items():
        req: Request = build_request(rid, rec)
        req.set_hasher(hasher)
        got = [h.hex() for h in req.block_hashes]
        assert got == rec["prompt_block_hashes"], f"{path.name}: request {rid} block hashes"
