"""Helpers shared by the feed tests."""

from __future__ import annotations

import time
from collections.abc import Callable

from pagedkv.runtime.events import BlockStored


def stored(block_hash: int) -> BlockStored:
    """One four-token BlockStored event for ``block_hash``."""
    return BlockStored(
        block_hashes=[block_hash], parent_block_hash=None, token_ids=[1, 2, 3, 4],
        block_size=4, lora_id=None, medium="GPU", lora_name=None,
    )  # fmt: skip


def wait_for(condition: Callable[[], bool], what: str, timeout_s: float = 20.0) -> None:
    """Poll ``condition`` until it holds; fail naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)
