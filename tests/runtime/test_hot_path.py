"""The decode hot path opens the undo journal only when an allocation changes more than
one thing (a plain step that takes or caches one block needs none)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pagedkv import KVCacheSpec
from pagedkv.errors import KVCacheRuntimeError
from pagedkv.runtime import KVCacheManager, Request
from pagedkv.runtime.coordinators import UnitaryCoordinator
from pagedkv.runtime.hashing import BlockHasher
from pagedkv.runtime.managers.base import Retention
from pagedkv.runtime.managers.full import FullAttentionManager

from .helpers import cached_blocks, check_invariants, full, kv_config, make_manager, mamba, swa


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
        # A plain step changes one block after every check: nothing to undo.
        journals = changed and manager._plain is None
        assert (calls[0] > begins) == journals, f"step {token}: changed={changed}"
        num_changed += changed
        num_quiet += not changed
    assert num_quiet and num_changed  # both kinds of step were exercised
    manager.free(req)
    assert calls[0] == (num_changed if manager._plain is None else 0)  # frees journal nothing
    assert (manager._plain is not None) == (caching and len(specs) == 1)


@pytest.mark.parametrize(
    ("specs", "kwargs", "plain"),
    [
        ([full()], {}, True),
        ([swa(8)], {}, False),  # sparse retention thins what it caches
        ([mamba()], {}, False),
        ([full()], {"retention": "dense"}, False),  # a retention plugin decides
        ([full(), full()], {}, False),  # two groups: the coordinator's own path
        ([full()], {"enable_caching": False}, False),
    ],
    ids=["full", "window", "mamba", "dense", "two-groups", "no-caching"],
)
def test_plain_steps_are_taken_where_nothing_overrides_them(
    specs: list[KVCacheSpec], kwargs: dict[str, Any], plain: bool
) -> None:
    manager = make_manager(specs, num_blocks=64, **kwargs)
    assert (manager._plain is not None) == plain


def test_a_plain_step_is_refused_where_the_group_takes_none() -> None:
    manager = make_manager([swa(8)], num_blocks=64)
    coordinator = manager.coordinator
    assert isinstance(coordinator, UnitaryCoordinator)
    with pytest.raises(KVCacheRuntimeError, match="takes no plain steps"):
        coordinator.step_plainly(Request("a", [1, 2]), 2, 2, True)


def test_a_group_keying_partial_tails_takes_no_plain_steps() -> None:
    m = make_manager([full()], num_blocks=64).managers[0]
    assert isinstance(m, FullAttentionManager) and m.takes_plain_steps()
    m.keys_partial_tails = True  # hashes finer than the block (hybrid models only)
    assert not m.takes_plain_steps()


def test_a_retention_that_overrides_caching_keeps_the_general_path() -> None:
    class EveryOther(Retention):
        def blocks_to_cache(
            self, manager: Any, request: Request, start: int, end: int
        ) -> set[int] | None:
            return set(range(start, end, 2))

    coordinator = UnitaryCoordinator(
        kv_config([full()], 64),
        max_model_len=256,
        enable_caching=True,
        hash_block_size=4,
        alignment_tokens=4,
        retention=EveryOther,
        retention_interval=0,
    )
    assert coordinator.plain_step is None


ops = st.lists(
    st.tuples(st.sampled_from(["admit", "step", "decode", "free"]), st.integers(0, 5)),
    max_size=60,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=ops, events=st.booleans(), lookahead=st.integers(0, 2))
def test_plain_steps_change_what_the_general_path_changes(
    ops: list[tuple[str, int]], events: bool, lookahead: int
) -> None:
    plain = make_manager([full()], num_blocks=24, enable_events=events)
    general = make_manager([full()], num_blocks=24, enable_events=events)
    general._plain = None  # the coordinator's own steps
    prompts = [[i % 3] * 6 + list(range(i, i + 9)) for i in range(6)]
    for op, i in ops:
        results = []
        for manager in (plain, general):
            results.append(_apply(manager, op, i, prompts[i], lookahead))
        assert results[0] == results[1]
        assert _state(plain) == _state(general)
        check_invariants(plain)


def _apply(manager: KVCacheManager, op: str, i: int, prompt: list[int], lookahead: int) -> Any:
    live: dict[str, Request] = manager.__dict__.setdefault("_test_requests", {})
    rid = str(i)
    req = live.get(rid)
    if op == "admit" or req is None:
        if req is not None:
            return "running"
        req = Request(rid, prompt, hasher=manager.hasher)
        hit, num_hit = manager.get_computed_blocks(req)
        num_new = min(7, req.num_tokens - num_hit)
        out = manager.allocate_slots(req, num_new, num_hit, hit, full_sequence_must_fit=True)
        if out is None:
            return None
        live[rid] = req
        req.num_computed_tokens = num_hit + num_new
        return out.get_block_ids()
    if op == "free":
        manager.free(req)
        del live[rid]
        return "freed"
    if req.num_computed_tokens >= req.num_tokens:
        req.append_output_token_ids(i + req.num_tokens)
    num_new = 1 if op == "decode" else min(5, req.num_tokens - req.num_computed_tokens)
    out = manager.allocate_slots(req, num_new, num_lookahead_tokens=lookahead)
    if out is not None:
        req.num_computed_tokens += num_new
        return out.get_block_ids()
    return None


def _state(manager: KVCacheManager) -> tuple[Any, ...]:
    pool = manager.block_pool
    return (
        pool.queue.order(),
        list(pool.ref_cnt),
        cached_blocks(pool),
        {r: list(t) for r, t in manager.managers[0].req_to_blocks.items()},
        dict(manager.managers[0].num_cached_block),
        manager.num_evictions,
        manager.take_events(),
    )


@pytest.mark.parametrize("plain", [True, False])
def test_a_step_that_delays_caching_still_takes_the_managers_hasher(plain: bool) -> None:
    # An equivalent but distinct hasher (an engine's own) is replaced as on every path.
    manager = make_manager([full()], num_blocks=16)
    if not plain:
        manager._plain = None
    req = Request("a", list(range(8)), hasher=manager.hasher)
    assert manager.allocate_slots(req, 8) is not None
    req.num_computed_tokens = 8
    req.append_output_token_ids(8)
    req.hasher = BlockHasher(manager.hasher.block_size, manager.hasher.hash_algo)
    assert manager.allocate_slots(req, 1, delay_cache_blocks=True) is not None  # a new block
    assert req.hasher is manager.hasher
    assert manager.managers[0].num_cached_block["a"] == 2  # the admission's two blocks


def test_a_plain_step_is_refused_inside_an_open_transaction() -> None:
    manager = make_manager([full()], num_blocks=16)
    req = Request("a", list(range(8)), hasher=manager.hasher)
    assert manager.allocate_slots(req, 8) is not None
    req.num_computed_tokens = 8
    req.append_output_token_ids(8)
    coordinator = manager.coordinator
    assert isinstance(coordinator, UnitaryCoordinator)
    pool = manager.block_pool
    before = (pool.queue.order(), list(pool.ref_cnt), manager.get_block_ids("a"))
    savepoint = pool.begin()
    with pytest.raises(KVCacheRuntimeError, match="outside one"):
        coordinator.step_plainly(req, 9, 9, True)
    pool.rollback(savepoint)
    assert (pool.queue.order(), list(pool.ref_cnt), manager.get_block_ids("a")) == before
