"""Mamba "align" boundary states offered to a KV connector (opt-in) and the retention
interval changed between steps (docs/runtime.md has the first example in prose)."""

from __future__ import annotations

import pytest

from pagedkv.errors import ConfigError
from pagedkv.runtime import KVCacheManager, Request

from .helpers import check_invariants, full, make_manager, mamba, mamba2


def offering_manager(**kwargs: object) -> KVCacheManager:
    # 64-token Mamba blocks hashed every 16 tokens; Mamba is group 1; dense retention.
    kwargs.setdefault("prefix_cache_retention_interval", None)
    manager = make_manager([full(64), mamba(64)], num_blocks=20, hash_block_size=16, **kwargs)
    manager.offer_boundary_states()
    return manager


def run(manager: KVCacheManager, req: Request, num_new: int) -> None:
    if req.num_computed_tokens == 0:
        hit, num_hit = manager.get_computed_blocks(req)
        assert manager.allocate_slots(req, num_new, num_hit, hit) is not None
        req.num_computed_tokens = num_hit + num_new
        return
    assert manager.allocate_slots(req, num_new) is not None
    req.num_computed_tokens += num_new


def test_off_by_default_records_nothing() -> None:
    manager = make_manager([full(64), mamba(64)], num_blocks=20, hash_block_size=16)
    a = Request("a", list(range(200)))
    run(manager, a, 128)
    assert manager.take_boundary_state_offloads() == {}
    assert all(getattr(m, "offers", None) is None for m in manager.managers)


def test_keyed_block_states_are_offered_once_with_their_block() -> None:
    manager = offering_manager()
    a = Request("a", list(range(200)))
    run(manager, a, 128)  # one chunk: only its end state (128) is written
    table = manager.get_block_ids("a")[1]
    assert table[0] == 0  # the null block: no state at 64
    assert manager.take_boundary_state_offloads() == {"a": [(1, table[1], 128)]}
    assert manager.take_boundary_state_offloads() == {}  # drained
    run(manager, a, 64)
    table = manager.get_block_ids("a")[1]
    assert manager.take_boundary_state_offloads() == {"a": [(1, table[2], 192)]}
    run(manager, a, 1)  # decoding inside a block keys nothing new
    assert manager.take_boundary_state_offloads() == {}
    check_invariants(manager)


def test_producer_partial_tail_is_offered_as_its_copy() -> None:
    manager = offering_manager()
    a = Request("a", list(range(100)))
    run(manager, a, 64)
    manager.take_boundary_state_offloads()
    run(manager, a, 32)  # keys the state at 96 inside block 1: a partial tail
    source = manager.get_block_ids("a")[1][1]
    assert manager.take_boundary_state_offloads() == {}  # the next step overwrites it
    run(manager, a, 4)  # copy on write: the key (and the offer) moves to the copy
    copies = manager.take_kv_cache_block_copies()
    (copy,) = [c.dst_block_id for c in copies.copies if c.src_block_id == source]
    assert manager.take_boundary_state_offloads() == {"a": [(1, copy, 96)]}
    assert manager.finalize_partial_tail_offloads("a", 100) == []  # already handed off
    manager.block_pool.free_blocks(copies.retained_blocks)
    check_invariants(manager)


def test_finishing_on_the_partial_tail_hands_off_the_table_block_once() -> None:
    manager = offering_manager()
    a = Request("a", list(range(100)))
    run(manager, a, 96)
    source = manager.get_block_ids("a")[1][1]
    assert manager.finalize_partial_tail_offloads("a", 96) == [(1, source, 96)]
    assert manager.finalize_partial_tail_offloads("a", 96) == []
    b = Request("b", list(range(1000, 1100)))
    run(manager, b, 96)
    # b computed past its tail (or has tokens in flight): its block no longer holds it
    assert manager.finalize_partial_tail_offloads("b", 97) == []
    assert manager.finalize_partial_tail_offloads("b", 96) == []  # consumed above


def test_freeing_a_request_drops_its_undrained_offers() -> None:
    manager = offering_manager()
    a = Request("a", list(range(200)))
    b = Request("b", list(range(1000, 1200)))
    run(manager, a, 128)
    run(manager, b, 64)
    manager.free(a)
    offers = manager.take_boundary_state_offloads()
    assert list(offers) == ["b"]


def test_a_failed_allocation_records_no_offer() -> None:
    manager = offering_manager(watermark=0.0)
    a = Request("a", list(range(200)))
    hit, num_hit = manager.get_computed_blocks(a)
    pool = manager.block_pool
    original = pool.get_new_blocks
    calls = []

    def fail_second(n: int) -> list[int]:
        calls.append(n)
        if len(calls) > 1:
            raise RuntimeError("injected")
        return original(n)

    pool.get_new_blocks = fail_second  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="injected"):
        manager.allocate_slots(a, 128, num_hit, hit)
    pool.get_new_blocks = original  # type: ignore[method-assign]
    assert manager.take_boundary_state_offloads() == {}


def test_retention_interval_changes_between_steps() -> None:
    manager = make_manager([full(64), mamba(64)], num_blocks=20, hash_block_size=16)
    manager.set_prefix_cache_retention_interval(0)  # keep only replay boundaries
    a = Request("a", list(range(300)))
    run(manager, a, 128)
    run(manager, a, 128)
    mamba_manager = manager.managers[1]
    assert mamba_manager.retention_interval == 0
    with pytest.raises(ConfigError, match="prefix_cache_retention_interval"):
        manager.set_prefix_cache_retention_interval(100)  # not a multiple of 64
    assert mamba_manager.retention_interval == 0


def test_a_checkpoint_on_a_block_boundary_is_offered_at_its_position() -> None:
    # EAGLE drops a hash unit: a 240-token prompt's checkpoint is 240 // 32 * 32 - 32 = 192,
    # exported by the final chunk 128..240 into table position 6 (which would hold 224).
    manager = make_manager(
        [full(32), mamba2(32, alignment=16)],
        num_blocks=40,
        hash_block_size=32,
        use_eagle=True,
        prefix_cache_retention_interval=None,
    )
    manager.offer_boundary_states()
    a = Request("a", list(range(240)))
    run(manager, a, 128)
    manager.take_boundary_state_offloads()
    manager.new_step_starts()
    run(manager, a, 112)
    table = manager.get_block_ids("a")[1]
    assert manager.take_boundary_state_offloads() == {"a": [(1, table[6], 192)]}
    # the key records its tokens though they are a block multiple (the block ends at 224)
    assert manager.block_pool.sub_block_key_tokens(table[6]) == 192


def test_popping_a_request_for_free_drops_its_offers_and_keeps_its_blocks() -> None:
    manager = offering_manager()
    a = Request("a", list(range(200)))
    run(manager, a, 128)
    tables = [list(m.req_to_blocks["a"]) for m in manager.managers]
    free_before = manager.block_pool.get_num_free_blocks()
    popped = [m.pop_blocks_for_free("a") for m in manager.managers]
    assert popped == tables
    assert all("a" not in m.req_to_blocks for m in manager.managers)
    assert manager.take_boundary_state_offloads() == {}
    assert manager.block_pool.get_num_free_blocks() == free_before  # not released yet
    manager.block_pool.free_blocks([b for table in popped for b in reversed(table) if b])
    check_invariants(manager)
