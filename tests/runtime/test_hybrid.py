"""Hybrid models: the fixed-point hit search and two-phase hit adoption (cases 22, 23, 36)."""

from __future__ import annotations

import pytest

from pagedkv.runtime import HybridCoordinator, Request, UnitaryCoordinator

from .helpers import check_invariants, full, make_manager, mamba, swa


def run(manager, rid: str, tokens: list[int]) -> Request:  # type: ignore[no-untyped-def]
    req = Request(rid, tokens)
    hit, num_hit = manager.get_computed_blocks(req)
    assert manager.allocate_slots(req, len(tokens) - num_hit, num_hit, hit) is not None
    req.num_computed_tokens = len(tokens)
    manager.new_step_starts()
    return req


def test_coordinator_kind_follows_groups_and_caching() -> None:
    assert isinstance(make_manager([full()]).coordinator, UnitaryCoordinator)
    assert isinstance(make_manager([full(), swa()]).coordinator, HybridCoordinator)


def test_hybrid_hit_is_bounded_by_every_group_and_aligned_to_the_lcm() -> None:
    # full attention block 4, sliding window block 8: hits are multiples of 8
    manager = make_manager([full(4), swa(16, 8)], num_blocks=64)
    assert manager.scheduler_block_size == 8 and manager.hash_block_size == 4
    manager.free(run(manager, "a", list(range(30))))
    blocks, num_hit = manager.get_computed_blocks(Request("b", list(range(30))))
    assert num_hit == 24  # full attention alone would hit 28
    assert len(blocks.blocks[0]) == 6 and len(blocks.blocks[1]) == 3


def test_hybrid_sliding_window_miss_shortens_the_full_attention_hit() -> None:
    manager = make_manager([full(), swa(8)], num_blocks=64, retention="dense")
    req = run(manager, "a", list(range(24)))
    sw_table = manager.get_block_ids("a")[1]
    manager.free(req)
    manager.block_pool.evict_blocks([sw_table[4]])  # window block of tokens 16..20
    blocks, num_hit = manager.get_computed_blocks(Request("b", list(range(24))))
    # full attention hits 20 tokens; the window needs blocks 3-4 for 20, 2-3 for 16
    assert num_hit == 16
    assert len(blocks.blocks[0]) == 4 and blocks.blocks[1][2:] == sw_table[2:4]


def test_hybrid_with_mamba_hit_lands_on_a_checkpoint() -> None:
    manager = make_manager([full(), swa(8), mamba()], num_blocks=96)
    a = Request("a", list(range(26)))
    manager.allocate_slots(a, 24)  # a chunk ending on the block boundary before the prompt end
    a.num_computed_tokens = 24
    manager.allocate_slots(a, 2)
    manager.free(a)
    manager.new_step_starts()
    blocks, num_hit = manager.get_computed_blocks(Request("b", list(range(26))))
    assert num_hit == 24
    assert blocks.blocks[2] == [0] * 5 + [blocks.blocks[2][5]] and blocks.blocks[2][5] != 0


def test_identical_groups_are_looked_up_together_full_attention_first() -> None:
    manager = make_manager([swa(8), full(), swa(8)], num_blocks=64, retention="dense")
    coordinator = manager.coordinator
    assert isinstance(coordinator, HybridCoordinator)
    assert [sg.group_ids for sg in coordinator.spec_groups] == [(1,), (0, 2)]
    req = run(manager, "a", list(range(16)))
    group2 = manager.get_block_ids("a")[2]
    manager.free(req)
    manager.block_pool.evict_blocks([group2[2]])  # only group 2 misses block 2
    _, num_hit = manager.get_computed_blocks(Request("b", list(range(17))))
    assert num_hit == 8


def test_hits_of_every_group_are_adopted_before_any_group_allocates() -> None:
    manager = make_manager([full(), full()], num_blocks=9)
    run(manager, "a", list(range(16)))  # 4 + 4 blocks: the pool is full
    g0, g1 = manager.managers
    pool = manager.block_pool
    # Group 1's first blocks at the head of the free queue: a one-phase allocation for
    # group 0 would evict group 1's hit.
    pool.free_blocks(g1.req_to_blocks.pop("a"))
    pool.free_blocks(reversed(g0.req_to_blocks.pop("a")))
    g0.num_cached_block.clear()
    g1.num_cached_block.clear()
    req = Request("b", [*range(12), 100, 101, 102, 103])
    hit, num_hit = manager.get_computed_blocks(req)
    assert num_hit == 12 and pool.queue.order()[0] == hit.blocks[1][0]
    assert manager.allocate_slots(req, 4, num_hit, hit) is not None
    ids = manager.get_block_ids("b")
    assert ids[1][:3] == hit.blocks[1] and set(ids[0]).isdisjoint(ids[1])
    check_invariants(manager, {"b": 16})


@pytest.mark.parametrize("delayed", [False, True])
def test_hybrid_caches_up_to_a_multiple_of_the_scheduler_block_size(delayed: bool) -> None:
    # vLLM's cacheable-token rule for several groups: block sizes 4 and 8 cache up to a
    # multiple of 8, in allocate_slots and in a delayed cache_blocks alike.
    manager = make_manager([full(4), full(8)], num_blocks=32)
    req = Request("a", list(range(12)))
    assert manager.allocate_slots(req, 12, delay_cache_blocks=delayed) is not None
    if delayed:
        manager.cache_blocks(req, 12)
    hashes = manager.block_pool.block_hash
    cached = [[hashes[b] is not None for b in table] for table in manager.get_block_ids("a")]
    assert cached == [[True, True, False], [True, False]]
