"""The decode hot path opens the undo journal only when an allocation changes something."""

from __future__ import annotations

import pytest

from pagedkv import KVCacheSpec
from pagedkv.runtime import KVCacheManager, Request

from .helpers import full, make_manager, mamba, swa


def count_begins(manager: KVCacheManager) -> list[int]:
    """Patch the pool so every ``begin`` is counted; returns the one-element counter."""
    pool = manager.block_pool
    begin = pool.begin
    calls = [0]

    def counting_begin() -> int:
        calls[0] += 1
        return begin()

    pool.begin = counting_begin  # type: ignore[method-assign]
    return calls


def table_state(manager: KVCacheManager, rid: str) -> list[tuple[int, int]]:
    return [(len(m.req_to_blocks[rid]), m.num_cached_block[rid]) for m in manager.managers]


@pytest.mark.parametrize(
    "specs",
    [
        [full()],  # one group, inlined path
        [full(), full()],  # same block size: lockstep path
        [full(), swa(8)],  # same block size with a window
        [full(4), full(8)],  # mixed block sizes: per-group path
        [full(), mamba()],  # Mamba "align": quiet steps return early, others the full path
    ],
    ids=["single", "lockstep", "window", "mixed", "mamba"],
)
@pytest.mark.parametrize("caching", [True, False])
def test_decode_steps_journal_only_when_tables_change(
    specs: list[KVCacheSpec], caching: bool
) -> None:
    manager = make_manager(specs, num_blocks=64, enable_caching=caching)
    req = Request("a", list(range(10)))
    manager.get_computed_blocks(req)
    assert manager.allocate_slots(req, 10) is not None
    req.num_computed_tokens = 10
    calls = count_begins(manager)
    num_quiet = num_changed = 0
    for token in range(40):
        req.append_output_token_ids(100 + token)
        before = table_state(manager, "a")
        begins = calls[0]
        assert manager.allocate_slots(req, 1) is not None
        req.num_computed_tokens += 1
        changed = table_state(manager, "a") != before
        assert (calls[0] > begins) == changed, f"step {token}: changed={changed}"
        num_changed += changed
        num_quiet += not changed
    assert num_quiet and num_changed  # both kinds of step were exercised
    manager.free(req)
    assert calls[0] == num_changed  # freeing journals nothing
