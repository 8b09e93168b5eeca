"""Eviction priority of blocks that fell out of a window, and the retained boundaries."""

from __future__ import annotations

import pytest

from pagedkv import BlockPool
from pagedkv.runtime import KVCacheManager, Request
from pagedkv.runtime.hashing import BlockHasher

from .helpers import cached_blocks, check_invariants, cross, full, make_manager, mamba, swa


def test_evict_early_puts_cached_blocks_at_the_front_of_the_cached_part() -> None:
    pool = BlockPool(8, hash_block_size=4)
    blocks = pool.get_new_blocks(4)
    req = Request("r", list(range(16)), hasher=BlockHasher(4))
    pool.cache_full_blocks(req, blocks, 0, 4, 4, 0)
    pool.free_blocks([blocks[0], blocks[1]])
    pool.free_blocks([blocks[3], blocks[2]], evict_first=True)
    assert pool.queue.order()[-4:] == [blocks[3], blocks[2], blocks[0], blocks[1]]


def test_out_of_window_blocks_are_evicted_before_other_cached_blocks() -> None:
    manager = make_manager([swa(8)], num_blocks=40, retention="dense")
    req = Request("a", list(range(40)))
    manager.allocate_slots(req, 32)
    req.num_computed_tokens = 32
    table = manager.get_block_ids("a")[0]
    manager.allocate_slots(req, 8)  # 25 tokens skipped: blocks 0-5 leave the window
    queue = manager.block_pool.queue.order()
    cached_part = queue[-len(manager.block_pool.queue.cached_order()) :]
    # Blocks 5..0 out of the window sit at the front of the cached part, except those
    # covering the window before the prompt end (39 -> blocks 7-8), none here.
    assert cached_part[:6] == table[:6][::-1]  # highest index first, as freed
    check_invariants(manager, {"a": 40})


def test_window_before_prompt_end_and_shared_junction_keeps_normal_priority() -> None:
    manager = make_manager([swa(8)], num_blocks=64, retention="dense")
    req = Request("a", list(range(24)))  # replay boundary 23 -> hit of 20 needs blocks 3, 4
    manager.allocate_slots(req, 24)
    req.num_computed_tokens = 24
    sw = manager.managers[0]
    assert sw.retention.retained["a"] == {3, 4}
    req.append_output_token_ids(list(range(16)))
    manager.allocate_slots(req, 16)
    table = manager.get_block_ids("a")[0]  # blocks 0-2 already left the window at 24
    req.num_computed_tokens = 40
    sw.remove_skipped_blocks("a", 40)  # 33 skipped: blocks 0-7
    lru = manager.block_pool.queue.cached_order()
    # Block 3 (left at 24 tokens) and block 4 (now) are at the tail; 5-7 in front.
    assert set(lru[:3]) == {table[5], table[6], table[7]}
    assert table[:3] == [0, 0, 0] and lru[-1] == table[4]
    manager.free(req)
    assert "a" not in sw.retention.retained


def test_hybrid_records_the_shared_prefix_junction() -> None:
    manager = make_manager([full(), swa(8)], num_blocks=64, retention="dense")
    a = Request("a", list(range(40)))
    manager.allocate_slots(a, 40)
    a.num_computed_tokens = 40
    window_blocks = manager.get_block_ids("a")[1]
    manager.free(a)
    manager.block_pool.evict_blocks([window_blocks[8]])
    b = Request("b", list(range(40)))
    hit, num_hit = manager.get_computed_blocks(b)
    assert num_hit == 32 and b.shared_prefix_boundary == 36
    manager.allocate_slots(b, 40 - num_hit, num_hit, hit)
    assert manager.managers[1].retention.retained["b"] >= {7, 8}


def test_cross_attention_is_sized_once_from_encoder_tokens_and_never_cached() -> None:
    manager = make_manager([full(), cross()], num_blocks=32, retention="dense")
    assert manager.enable_caching is False
    req = Request("a", list(range(6)))
    new = manager.allocate_slots(req, 6, num_encoder_tokens=10)
    assert new is not None and [len(ids) for ids in new.blocks] == [2, 3]
    req.num_computed_tokens = 6
    req.append_output_token_ids([1, 2, 3])
    new = manager.allocate_slots(req, 3)
    assert new is not None and [len(ids) for ids in manager.get_block_ids("a")] == [3, 3]
    manager.free(req)
    assert manager.num_free_blocks == 31


def test_mamba_superseded_checkpoints_are_evicted_early_except_at_the_prompt_end() -> None:
    manager = make_manager([mamba()], num_blocks=64, retention="dense")
    req = Request("a", list(range(21)))
    states = []
    for chunk in (8, 8, 4, 1):  # block-aligned chunks, as vLLM's scheduler splits them
        new = manager.allocate_slots(req, chunk)
        assert new is not None
        states.append(new.blocks[0][-1])
        req.num_computed_tokens += chunk
    req.append_output_token_ids(1)
    manager.allocate_slots(req, 1)  # 21 computed: the states up to token 20 are freed
    lru = manager.block_pool.queue.cached_order()
    # prompt end 20 -> the state after token 20 (states[2]) keeps normal priority
    assert lru == [states[1], states[0], states[2]]


def test_adopted_hit_keeps_normal_priority_when_it_leaves_the_window() -> None:
    manager = make_manager([mamba()], num_blocks=64, retention="dense")
    a = Request("a", list(range(16)))
    manager.allocate_slots(a, 16)
    manager.free(a)
    manager.new_step_starts()
    b = Request("b", [*range(16), 50, 51, 52, 53, 54, 55, 56, 57, 58])  # shares 16 tokens
    hit, num_hit = manager.get_computed_blocks(b)
    assert num_hit == 16
    checkpoint = hit.blocks[0][3]
    manager.allocate_slots(b, 25 - num_hit, num_hit, hit)
    b.num_computed_tokens = 25
    b.append_output_token_ids(1)
    manager.allocate_slots(b, 1)  # the adopted checkpoint is superseded and freed
    assert manager.block_pool.queue.cached_order()[-1] == checkpoint  # tail, not the front


def test_freed_window_blocks_outside_retained_points_are_evicted_first() -> None:
    manager = make_manager([full(), swa(8)], num_blocks=64, retention="dense")
    req = Request("a", list(range(12)))  # prompt end 11 -> hit of 8 needs window blocks 0, 1
    manager.allocate_slots(req, 12)
    prompt_window = manager.get_block_ids("a")[1][:2]
    req.num_computed_tokens = 12
    req.append_output_token_ids([1, 2, 3, 4])
    manager.allocate_slots(req, 4)  # 16 tokens: window block 3 (decode) is full and cached
    req.num_computed_tokens = 16
    window_table = manager.get_block_ids("a")[1]
    manager.free(req)
    lru = manager.block_pool.queue.cached_order()
    early = {b for b in window_table[2:] if b}
    assert set(lru[: len(early)]) == early  # blocks no retained point needs go first
    assert set(prompt_window) <= set(lru[len(early) :])  # the prompt-end window stays


def test_retention_is_chosen_by_name_on_the_engine_config_or_the_manager() -> None:
    from pagedkv import EngineConfig
    from pagedkv.errors import ConfigError

    from .helpers import kv_config

    kv = kv_config([full(), swa(8)], 64)
    default = KVCacheManager(kv, EngineConfig.create(max_model_len=256))
    dense = KVCacheManager(
        kv, EngineConfig.create(max_model_len=256, prefix_cache_retention="dense")
    )
    assert default.retention == "vllm" and dense.retention == "dense"
    assert (
        KVCacheManager(kv, EngineConfig.create(max_model_len=256), retention="dense").retention
        == "dense"
    )
    with pytest.raises(ConfigError, match="prefix_cache_retention"):
        EngineConfig.create(prefix_cache_retention="sparse")
    with pytest.raises(ConfigError, match="retention"):
        KVCacheManager(kv, EngineConfig.create(max_model_len=256), retention="lru")
    # Dense caches every window block; vLLM's only the window a prompt-end hit needs.
    for manager, num_cached in ((default, 2), (dense, 6)):
        req = Request("a", list(range(25)))
        manager.allocate_slots(req, 24)
        window = manager.get_block_ids("a")[1]
        assert sum(manager.block_pool.block_hash[b] is not None for b in window) == num_cached


def test_window_positions_keep_each_segment_tail_and_the_boundary_windows() -> None:
    from pagedkv.runtime.managers import SlidingWindowManager

    spec = swa(window=9, block_size=4)  # a hit needs cdiv(8, 4) = 2 blocks
    rule = SlidingWindowManager.reachable_positions
    # 16-token segments (4 blocks): the last 2 blocks of each.
    assert rule(spec, 0, 12, 4, False, 16) == {2, 3, 6, 7, 10, 11}
    # Interval 0: only the window before each boundary (floored to alignment 8).
    assert rule(spec, 0, 12, 8, False, 0, (23,)) == {2, 3}
    # EAGLE keeps the block past the window too.
    assert rule(spec, 0, 12, 8, True, 0, (23,)) == {2, 3, 4}
    # A window as long as a segment: every block.
    assert rule(spec, 0, 12, 8, False, None) is None
    # A sub-block alignment cannot be expressed per block: every block.
    assert rule(spec, 0, 12, 6, False, 0) is None


def test_window_positions_keep_the_final_short_segment_window() -> None:
    from pagedkv.runtime.managers import SlidingWindowManager

    spec = swa(window=9, block_size=4)
    rule = SlidingWindowManager.reachable_positions
    # Segments of 4 blocks; the request ends before block 11, inside segment 8..11.
    assert rule(spec, 4, 11, 4, False, 16) == {6, 7, 10}
    assert rule(spec, 4, 11, 4, False, 16, final_segment_end=11) == {6, 7, 9, 10}
    # Not under EAGLE, and not when the last segment is whole.
    eagle = {4, 6, 7, 8, 10}
    assert rule(spec, 4, 11, 4, True, 16) == eagle
    assert rule(spec, 4, 11, 4, True, 16, final_segment_end=11) == eagle
    assert rule(spec, 4, 11, 4, False, 16, final_segment_end=8) == {6, 7, 10}


def test_mamba_positions_keep_one_state_per_segment_and_the_boundary_states() -> None:
    from pagedkv.runtime.managers import MambaManager

    rule = MambaManager.reachable_positions
    assert rule(4, 0, 16, 4, None, (63,)) is None
    assert rule(4, 0, 16, 4, 4, (63,)) is None  # every block ends a segment
    assert rule(4, 0, 16, 4, 16, (55,)) == {3, 7, 11, 12, 15}
    assert rule(4, 0, 16, 8, 0, (55, 21)) == {3, 11}
    assert rule(4, 5, 16, 4, 0, (8, 400)) == set()  # boundaries outside the range


def test_setting_the_retention_interval_changes_what_is_cached_next() -> None:
    def num_cached(manager: KVCacheManager) -> int:
        req = Request("a", list(range(64)))
        manager.allocate_slots(req, 64)
        return sum(map(len, cached_blocks(manager.block_pool).values()))

    dense = make_manager([swa(8)], num_blocks=40, prefix_cache_retention_interval=None)
    sparse = make_manager([swa(8)], num_blocks=40, prefix_cache_retention_interval=None)
    sparse.set_prefix_cache_retention_interval(0)
    assert sparse.managers[0].retention_interval == 0
    assert num_cached(sparse) < num_cached(dense) == 16
