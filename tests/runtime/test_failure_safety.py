"""A refused or failed allocate_slots leaves pool, hash map and requests as they were."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from pagedkv.runtime import BlockPool, KVCacheManager, Request

from .helpers import cached_blocks, check_invariants, full, make_manager, mamba, swa


class Injected(RuntimeError):
    pass


def snapshot(manager: KVCacheManager) -> dict[str, Any]:
    pool = manager.block_pool
    return {
        "free": sorted(pool.queue.order()),
        "ref": list(pool.ref_cnt),
        "keys": [pool.key_of(b) for b in range(pool.num_blocks)],
        "cached": cached_blocks(pool),
        "tables": [{r: list(t) for r, t in m.req_to_blocks.items()} for m in manager.managers],
        "num_cached": [dict(m.num_cached_block) for m in manager.managers],
        "evictions": manager.num_evictions,
        # Mamba's per-step state: hashes cached this step, the block each request reads.
        "mamba": [
            (set(getattr(m, "_cached_this_step", ())), dict(getattr(m, "_last_state", {})))
            for m in manager.managers
        ],
    }


def warm(manager: KVCacheManager) -> None:
    """Cached free blocks, a running request and fresh blocks in the pool."""
    a = Request("a", list(range(20)))
    manager.allocate_slots(a, 16)  # block-aligned chunks: a Mamba state at token 16
    a.num_computed_tokens = 16
    manager.allocate_slots(a, 4)
    manager.free(a)
    manager.new_step_starts()
    running = Request("run", [7] * 9)
    manager.allocate_slots(running, 9)
    running.num_computed_tokens = 9


def test_refused_allocation_changes_nothing() -> None:
    manager = make_manager([full(), swa(8)], num_blocks=20)
    warm(manager)
    before = snapshot(manager)
    req = Request("big", list(range(100)))
    hit, num_hit = manager.get_computed_blocks(req)
    assert num_hit == 16  # vLLM retention keeps the window ending at the prompt end (19)
    assert manager.allocate_slots(req, 100 - num_hit, num_hit, hit) is None
    assert snapshot(manager) == before


def fail_on_call(monkeypatch: pytest.MonkeyPatch, obj: object, name: str, call: int) -> None:
    original = getattr(obj, name)
    calls = {"n": 0}

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        result = original(*args, **kwargs)
        if calls["n"] == call:
            raise Injected(f"{name} call {call}")
        return result

    monkeypatch.setattr(obj, name, wrapper)


@pytest.mark.parametrize(
    ("method", "call"),
    [("get_new_blocks", 2), ("cache_full_blocks", 2), ("get_new_blocks", 3), ("touch", 2)],
)
def test_exception_mid_allocation_of_a_new_request_is_rolled_back(
    monkeypatch: pytest.MonkeyPatch, method: str, call: int
) -> None:
    manager = make_manager([full(), swa(8), mamba()], num_blocks=40, enable_events=True)
    warm(manager)
    manager.take_events()
    before = snapshot(manager)
    req = Request("b", list(range(30)))
    hit, num_hit = manager.get_computed_blocks(req)
    assert num_hit == 16
    fail_on_call(monkeypatch, manager.block_pool, method, call)
    with pytest.raises(Injected):
        manager.allocate_slots(req, 30 - num_hit, num_hit, hit)
    assert snapshot(manager) == before
    assert manager.take_events() == []
    check_invariants(manager)
    monkeypatch.undo()
    assert manager.allocate_slots(req, 30 - num_hit, num_hit, hit) is not None
    check_invariants(manager)


def test_exception_mid_allocation_of_a_running_request_is_rolled_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    manager = make_manager([full(), full(8)], num_blocks=40)
    warm(manager)
    running = Request("r2", list(range(50, 62)))
    manager.allocate_slots(running, 12)
    running.num_computed_tokens = 12
    running.append_output_token_ids(list(range(10)))
    before = snapshot(manager)
    fail_on_call(monkeypatch, manager.block_pool, "cache_full_blocks", 2)
    with pytest.raises(Injected):
        manager.allocate_slots(running, 10)
    assert snapshot(manager) == before


@pytest.mark.parametrize("method", ["get_new_blocks", "cache_full_blocks"])
def test_exception_in_a_one_group_running_allocation_is_rolled_back(
    monkeypatch: pytest.MonkeyPatch, method: str
) -> None:
    manager = make_manager([full()], num_blocks=40, enable_events=True)
    warm(manager)
    running = Request("r2", list(range(50, 62)))
    manager.allocate_slots(running, 12)
    running.num_computed_tokens = 12
    running.append_output_token_ids(list(range(10)))
    manager.take_events()
    before = snapshot(manager)
    fail_on_call(monkeypatch, manager.block_pool, method, 1)
    with pytest.raises(Injected):
        manager.allocate_slots(running, 10)
    assert snapshot(manager) == before
    assert manager.take_events() == []


def test_evictions_of_a_failed_allocation_are_not_counted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    manager = make_manager([full()], num_blocks=9, enable_events=True)
    a = Request("a", list(range(32)))
    manager.allocate_slots(a, 32)
    manager.free(a)  # 8 cached free blocks, nothing else free
    manager.take_events()
    before = snapshot(manager)
    fail_on_call(monkeypatch, manager.block_pool, "get_new_blocks", 1)
    with pytest.raises(Injected):
        manager.allocate_slots(Request("b", [9] * 12), 12)  # evicts 3 cached blocks
    assert snapshot(manager) == before and manager.num_evictions == 0
    monkeypatch.undo()
    manager.allocate_slots(Request("b", [9] * 12), 12)
    assert manager.num_evictions == 3


@pytest.mark.parametrize(("method", "call"), [("get_new_blocks", 1), ("cache_full_blocks", 2)])
def test_exception_in_a_lockstep_running_allocation_is_rolled_back(
    monkeypatch: pytest.MonkeyPatch, method: str, call: int
) -> None:
    # Groups of one block size grow in step: one pool allocation serves them all.
    manager = make_manager([full(), swa(8), swa(8)], num_blocks=40, enable_events=True)
    warm(manager)
    running = Request("r2", list(range(50, 62)))
    manager.allocate_slots(running, 12)
    running.num_computed_tokens = 12
    running.append_output_token_ids(list(range(10)))
    manager.remove_skipped_blocks("r2", 12)  # out-of-window blocks go before any change
    manager.take_events()
    before = snapshot(manager)
    fail_on_call(monkeypatch, manager.block_pool, method, call)
    with pytest.raises(Injected):
        manager.allocate_slots(running, 10)
    assert snapshot(manager) == before
    assert manager.take_events() == []
    monkeypatch.undo()
    new = manager.allocate_slots(running, 10)
    assert new is not None and [len(blocks) for blocks in new.blocks] == [3, 3, 3]
    check_invariants(manager, {"r2": 22, "run": 9})


def test_rolled_back_mamba_caching_does_not_hold_back_a_later_hit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Mamba refuses a hit on a state cached in the current step; a rolled-back allocation
    # cached nothing, so an older block with the same hash must stay usable.
    manager = make_manager([mamba(), full()], num_blocks=40, retention="dense")
    prompt = list(range(16))
    a = Request("a", prompt)
    for start in range(0, 16, 4):  # one state block per chunk
        manager.allocate_slots(a, 4)
        a.num_computed_tokens = start + 4
        manager.new_step_starts()
    manager.free(a)  # states at 4, 8, 12, 16 cached
    manager.new_step_starts()
    b = Request("b", prompt)
    hit, num_hit = manager.get_computed_blocks(b)
    assert num_hit == 12
    fail_on_call(monkeypatch, manager.block_pool, "cache_full_blocks", 2)  # the full group's
    with pytest.raises(Injected):
        manager.allocate_slots(b, 4, num_hit, hit)  # would cache b's state at 16 again
    monkeypatch.undo()
    c = Request("c", [*prompt, 99])
    hit, num_hit = manager.get_computed_blocks(c)
    assert num_hit == 16
    assert manager.allocate_slots(c, 1, num_hit, hit) is not None


def test_a_failed_allocation_leaves_dense_retention_as_it_was(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Dense retention keeps the positions a hit needs: they change only once the
    # allocation commits (BlockPool.on_commit), so a retention needs no undo.
    manager = make_manager([full(), swa(8)], num_blocks=40, retention="dense")
    warm(manager)
    window = manager.managers[1].retention
    before = copy.deepcopy(window.retained)  # type: ignore[attr-defined]
    req = Request("b", list(range(30)))
    hit, num_hit = manager.get_computed_blocks(req)
    fail_on_call(monkeypatch, manager.block_pool, "cache_full_blocks", 2)  # the window's
    with pytest.raises(Injected):
        manager.allocate_slots(req, 30 - num_hit, num_hit, hit)
    assert window.retained == before  # type: ignore[attr-defined]
    monkeypatch.undo()
    assert manager.allocate_slots(req, 30 - num_hit, num_hit, hit) is not None
    assert "b" in window.retained  # type: ignore[attr-defined]


def test_on_commit_waits_for_the_commit_and_a_rollback_drops_it() -> None:
    pool = BlockPool(4)
    seen: list[int] = []
    pool.on_commit(seen.append, 1)  # no transaction: at once
    assert seen == [1]
    pool.begin()
    pool.on_commit(seen.append, 2)
    assert seen == [1]
    pool.commit()
    assert seen == [1, 2]
    savepoint = pool.begin()
    pool.on_commit(seen.append, 3)
    pool.rollback(savepoint)
    pool.begin()
    pool.commit()
    assert seen == [1, 2]


def test_a_host_pool_defers_to_its_owners_commit() -> None:
    from pagedkv.runtime.hisparse.host_pool import HostBlockPool

    owner = BlockPool(4)
    host = HostBlockPool(4, owner)
    seen: list[int] = []
    savepoint = owner.begin()
    host.on_commit(seen.append, 1)
    owner.rollback(savepoint)
    owner.begin()
    host.on_commit(seen.append, 2)
    assert seen == []
    owner.commit()
    assert seen == [2]
