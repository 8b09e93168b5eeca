"""KVCacheManager API behaviour (reference section 9, cases 29-36) and statistics."""

from __future__ import annotations

import pytest

from pagedkv import EngineConfig, KVCacheConfig, KVCacheGroupSpec, KVCacheSpec
from pagedkv.errors import KVCacheRuntimeError
from pagedkv.registry import KVCacheSpecRegistry
from pagedkv.runtime import FullAttentionManager, KVCacheBlocks, KVCacheManager, Request
from pagedkv.runtime.events import BlockRemoved

from .helpers import cached_blocks, check_invariants, chunked, full, make_manager, swa


def admit(manager, rid: str, tokens: list[int], **kw: object) -> Request:  # type: ignore[no-untyped-def]
    req = Request(rid, tokens)
    hit, num_hit = manager.get_computed_blocks(req)
    assert manager.allocate_slots(req, len(tokens) - num_hit, num_hit, hit, **kw) is not None
    req.num_computed_tokens = len(tokens)
    return req


def test_free_cached_hits_count_against_free_blocks_in_use_hits_do_not() -> None:
    manager = make_manager([full()], num_blocks=9)
    a = admit(manager, "a", list(range(16)))
    manager.free(a)  # 4 cached free blocks; 8 free in total
    b = Request("b", list(range(17)))
    hit, num_hit = manager.get_computed_blocks(b)
    m = manager.managers[0]
    assert num_hit == 16
    assert m.get_num_blocks_to_allocate("b", 17, hit.blocks[0], 16, 17) == 1 + 4
    manager.allocate_slots(b, 1, num_hit, hit)
    c = Request("c", list(range(17)))
    hit, _ = manager.get_computed_blocks(c)
    assert m.get_num_blocks_to_allocate("c", 17, hit.blocks[0], 16, 17) == 1  # hits held by b


def test_running_request_cannot_adopt_cached_blocks() -> None:
    manager = make_manager([full()])
    a = admit(manager, "a", list(range(8)))
    with pytest.raises(KVCacheRuntimeError, match="running"):
        manager.allocate_slots(a, 1, 4, KVCacheBlocks(([1],)))


def test_zero_new_tokens_without_computed_tokens_is_an_error() -> None:
    manager = make_manager([full()])
    with pytest.raises(KVCacheRuntimeError, match="num_new_tokens"):
        manager.allocate_slots(Request("a", [1, 2]), 0)


def test_refused_allocation_may_still_release_out_of_window_blocks() -> None:
    manager = make_manager([swa(4)], num_blocks=7)
    req = Request("a", list(range(60)))
    assert manager.allocate_slots(req, 24) is not None  # 6 blocks, pool full
    req.num_computed_tokens = 24
    assert manager.allocate_slots(req, 24) is None  # 21 tokens skipped frees 5; needs 6
    assert manager.get_block_ids("a")[0][:5] == [0] * 5
    assert manager.num_free_blocks == 5
    check_invariants(manager, {"a": 24})


def test_watermark_applies_only_to_new_requests_when_others_are_scheduled() -> None:
    manager = make_manager([full()], num_blocks=10, watermark=0.2)  # 2 blocks reserved
    req = Request("a", list(range(32)))
    assert manager.allocate_slots(req, 32) is None  # 8 + 2 > 9 free
    assert manager.allocate_slots(req, 32, has_scheduled_reqs=False) is not None
    manager.free(req)
    running = admit(manager, "b", list(range(28)))  # 7 blocks + 2 reserved fit in 9
    running.append_output_token_ids([1, 2, 3, 4, 5])
    assert manager.allocate_slots(running, 5) is not None  # running: no watermark


def test_lookahead_slots_are_allocated_but_never_cached() -> None:
    manager = make_manager([full()])
    req = Request("a", list(range(8)))
    new = manager.allocate_slots(req, 8, num_lookahead_tokens=8)
    assert new is not None and len(new.blocks[0]) == 4
    pool = manager.block_pool
    assert [pool.block_hash[b] is not None for b in new.blocks[0]] == [True, True, False, False]


def test_delayed_caching_allocates_without_caching() -> None:
    manager = make_manager([full()])
    req = Request("a", list(range(8)))
    new = manager.allocate_slots(req, 8, delay_cache_blocks=True)
    assert new is not None
    assert all(manager.block_pool.block_hash[b] is None for b in new.blocks[0])
    manager.cache_blocks(req, 8)
    assert all(manager.block_pool.block_hash[b] is not None for b in new.blocks[0])


def test_get_block_ids_returns_a_copy_per_group_and_empty_for_unknown() -> None:
    manager = make_manager([full(), swa(8)])
    admit(manager, "a", list(range(9)))
    ids = manager.get_block_ids("a")
    assert len(ids) == 2 and len(ids[0]) == 3
    ids[0].append(99)
    assert len(manager.get_block_ids("a")[0]) == 3
    assert manager.get_block_ids("nope") == ([], [])
    blocks = manager.get_blocks("a")
    assert blocks.blocks == manager.get_block_ids("a")
    assert blocks.blocks == tuple(m.req_to_blocks["a"] for m in manager.managers)
    assert manager.get_blocks("nope").blocks == ([], [])
    assert manager.block_pool.get_num_free_blocks() == manager.num_free_blocks == 32 - 1 - 6


def test_prefix_cache_stats_per_step_and_in_total() -> None:
    manager = make_manager([full()])
    manager.free(admit(manager, "a", list(range(12))))
    b = Request("b", list(range(12)))
    b.num_preemptions = 1
    manager.get_computed_blocks(b)
    step = manager.make_prefix_cache_stats()
    assert (step.requests, step.queries, step.hits) == (1, 12, 0)
    assert (step.preempted_requests, step.preempted_queries, step.preempted_hits) == (1, 12, 8)
    manager.get_computed_blocks(Request("c", list(range(13))))
    assert manager.make_prefix_cache_stats().hits == 12
    total = manager.prefix_cache_stats
    assert (total.requests, total.queries, total.hits) == (2, 25, 12)
    assert total.hit_rate == pytest.approx(12 / 25)


def test_reset_prefix_cache_through_the_manager_marks_stats() -> None:
    manager = make_manager([full()])
    a = admit(manager, "a", list(range(12)))
    assert manager.reset_prefix_cache() is False
    manager.free(a)
    assert manager.reset_prefix_cache() is True
    assert manager.prefix_cache_stats.reset
    assert manager.get_computed_blocks(Request("b", list(range(12))))[1] == 0


def test_caching_disabled_never_hits_and_never_hashes() -> None:
    manager = make_manager([full()], enable_caching=False)
    manager.free(admit(manager, "a", list(range(12))))
    req = Request("b", list(range(12)))
    assert manager.get_computed_blocks(req)[1] == 0
    assert req.block_hashes == []
    assert cached_blocks(manager.block_pool) == {}


def test_max_model_len_caps_the_slots() -> None:
    manager = make_manager([full()], max_model_len=16)
    req = Request("a", list(range(12)))
    new = manager.allocate_slots(req, 12, num_lookahead_tokens=20)
    assert new is not None and len(manager.get_block_ids("a")[0]) == 4


@pytest.mark.parametrize("caching", [True, False])
def test_prompt_longer_than_max_model_len_is_a_typed_error(caching: bool) -> None:
    manager = make_manager([full()], max_model_len=16, enable_caching=caching)
    req = Request("long", list(range(40)))
    with pytest.raises(KVCacheRuntimeError, match=r"'long'.*40 tokens.*max_model_len=16"):
        manager.allocate_slots(req, 40)
    assert manager.get_block_ids("long") == ([],)
    assert manager.num_free_blocks == 31 and cached_blocks(manager.block_pool) == {}


def test_decoding_past_max_model_len_is_a_typed_error() -> None:
    manager = make_manager([full()], max_model_len=16)
    req = admit(manager, "a", list(range(16)))
    table = manager.get_block_ids("a")
    req.append_output_token_ids(7)
    with pytest.raises(KVCacheRuntimeError, match=r"'a'.*17 tokens.*max_model_len=16"):
        manager.allocate_slots(req, 1)
    assert manager.get_block_ids("a") == table
    check_invariants(manager, {"a": 16})


def test_negative_lookahead_is_a_typed_error() -> None:
    manager = make_manager([full()])
    with pytest.raises(KVCacheRuntimeError, match="num_lookahead_tokens"):
        manager.allocate_slots(Request("a", [1, 2, 3]), 3, num_lookahead_tokens=-5)
    running = admit(manager, "b", list(range(8)))
    with pytest.raises(KVCacheRuntimeError, match="num_lookahead_tokens"):
        manager.allocate_slots(running, 1, num_lookahead_tokens=-1)


@pytest.mark.parametrize("num_computed", [5, -1])
def test_adopting_computed_tokens_the_request_lacks_is_a_typed_error(num_computed: int) -> None:
    manager = make_manager([full()])
    with pytest.raises(KVCacheRuntimeError, match=f"'c' adopts {num_computed} computed tokens"):
        manager.allocate_slots(Request("c", [1, 2, 3]), 2, num_new_computed_tokens=num_computed)
    assert manager.get_block_ids("c") == ([],)


def test_evictions_are_counted_in_total_and_per_step() -> None:
    manager = make_manager([full()], num_blocks=9, enable_events=True)
    manager.free(admit(manager, "a", list(range(32))))  # 8 cached free blocks
    assert manager.num_evictions == 0
    manager.make_prefix_cache_stats()
    manager.free(admit(manager, "b", [9] * 12))  # reuses 3 cached blocks
    manager.evict_blocks([5, 5, 0])  # one more cached block dropped; then nothing
    removed = [e for e in manager.take_events() if isinstance(e, BlockRemoved)]
    assert manager.num_evictions == 4 == sum(len(e.block_hashes) for e in removed)
    assert manager.make_prefix_cache_stats().evictions == 4
    assert manager.make_prefix_cache_stats().evictions == 0
    assert manager.prefix_cache_stats.evictions == 4


def test_attention_free_model_allocates_nothing() -> None:
    manager = make_manager([], num_blocks=1)
    req = Request("a", [1, 2, 3])
    assert manager.get_computed_blocks(req)[1] == 0
    assert manager.allocate_slots(req, 3) == KVCacheBlocks(())
    assert manager.usage == 0.0


class _CountingFullManager(FullAttentionManager):
    """A custom manager that allocates its own way (counts its calls)."""

    calls = 0

    def allocate_new_blocks(
        self, request_id: str, num_tokens: int, num_tokens_main_model: int
    ) -> list[int]:
        type(self).calls += 1
        return super().allocate_new_blocks(request_id, num_tokens, num_tokens_main_model)


def test_a_manager_that_allocates_its_own_way_is_called_for_running_requests() -> None:
    KVCacheSpecRegistry.register_role_manager("counting-test", _CountingFullManager)
    groups = (
        KVCacheGroupSpec(layer_names=("l0",), kv_cache_spec=full(), role="counting-test"),
        KVCacheGroupSpec(layer_names=("l1",), kv_cache_spec=swa(8)),
    )
    kv = KVCacheConfig(num_blocks=32, kv_cache_tensors=(), kv_cache_groups=groups)
    manager = KVCacheManager(kv, EngineConfig.create(max_model_len=256))
    req = admit(manager, "a", list(range(8)))
    before = _CountingFullManager.calls
    req.append_output_token_ids(1)
    new = manager.allocate_slots(req, 1)  # a running request crossing a block boundary
    assert _CountingFullManager.calls == before + 1
    assert new is not None and [len(b) for b in new.blocks] == [1, 1]


@pytest.mark.parametrize(
    "specs", [[full()], [full(), full()], [full(4), full(8)]], ids=["single", "lockstep", "mixed"]
)
def test_delayed_caching_of_a_running_request(specs: list[KVCacheSpec]) -> None:
    manager = make_manager(specs)
    req = Request("a", list(range(6)))
    manager.get_computed_blocks(req)
    assert manager.allocate_slots(req, 6, delay_cache_blocks=True) is not None
    req.num_computed_tokens = 6
    req.append_output_token_ids([6, 7])  # 8 tokens: every block full
    assert manager.allocate_slots(req, 2, delay_cache_blocks=True) is not None
    pool = manager.block_pool
    tables = manager.get_block_ids("a")
    assert all(pool.block_hash[b] is None for table in tables for b in table)
    manager.cache_blocks(req, 8)
    assert all(pool.block_hash[b] is not None for table in tables for b in table)
    assert [m.num_cached_block["a"] for m in manager.managers] == [
        8 // m.block_size for m in manager.managers
    ]


def test_remove_skipped_blocks_nulls_every_windowed_group_and_ignores_unknown_requests() -> None:
    manager = make_manager([full(), swa(8), swa(8), chunked(8)], num_blocks=40)
    admit(manager, "a", list(range(20)))
    free_before = manager.num_free_blocks
    manager.remove_skipped_blocks("a", 20)
    nulls = [m.get_num_skipped_tokens(20) // m.block_size for m in manager.managers]
    assert nulls == [0, 3, 3, 4]
    for table, num_nulls in zip(manager.get_block_ids("a"), nulls, strict=True):
        assert table[:num_nulls] == [0] * num_nulls and 0 not in table[num_nulls:]
    assert manager.num_free_blocks == free_before + sum(nulls)
    manager.remove_skipped_blocks("a", 20)  # nothing new to remove
    manager.remove_skipped_blocks("unknown", 20)
    assert manager.num_free_blocks == free_before + sum(nulls)
    check_invariants(manager, {"a": 20})


def test_a_request_skipping_prefix_cache_reads_finds_no_hit_but_caches() -> None:
    manager = make_manager([full()], num_blocks=12)
    manager.free(admit(manager, "a", list(range(16))))
    b = Request("b", list(range(17)))
    b.skip_reading_prefix_cache = True  # e.g. prompt logprobs need every token computed
    assert manager.get_computed_blocks(b) == (manager.get_computed_blocks(Request("x", [99])))
    hit, num_hit = manager.get_computed_blocks(b)
    assert num_hit == 0 and not any(hit.blocks)
    assert manager.allocate_slots(b, 17) is not None
    c = Request("c", list(range(17)))
    assert manager.get_computed_blocks(c)[1] == 16  # a reader still hits


def test_reserved_blocks_stay_free_for_other_sequences() -> None:
    manager = make_manager([full()], num_blocks=11)  # ten usable blocks
    # The first chunk (1 block) must leave the reserve free; the whole prompt need not.
    req = Request("a", list(range(32)))
    assert manager.allocate_slots(req, 3, reserved_blocks=10) is None
    assert manager.allocate_slots(req, 3, reserved_blocks=9, full_sequence_must_fit=True)
    req.num_computed_tokens = 3
    # A step that needs no block still fails while the reserve is not free.
    assert manager.allocate_slots(req, 1, reserved_blocks=10) is None
    assert manager.allocate_slots(req, 1, reserved_blocks=9) is not None


def test_external_computed_tokens_get_blocks_after_the_adopted_hits() -> None:
    manager = make_manager([full(), swa(8)], num_blocks=16, prefix_cache_retention_interval=None)
    manager.free(admit(manager, "a", list(range(8))))  # 2 cached blocks per group
    b = Request("b", list(range(20)))
    hit, num_hit = manager.get_computed_blocks(b)
    assert num_hit == 8
    hits = [list(g) for g in hit.blocks]
    free_before = manager.num_free_blocks
    new = manager.allocate_slots(b, 4, num_hit, hit, num_external_computed_tokens=8)
    assert new is not None
    full_table, swa_table = manager.get_block_ids("b")
    # Full attention: the hits, 2 blocks for the loaded tokens, 1 for the new ones.
    assert full_table[:2] == hits[0] and len(full_table) == 5
    assert new.blocks[0] == full_table[4:]
    # The window (8 tokens) of 16 computed ones: blocks before it are nulls.
    assert swa_table[:2] == [0, 0] and 0 not in swa_table[2:] and len(swa_table) == 5
    assert manager.num_free_blocks == free_before - 3 - 3 - 2  # hits left the queue too
    check_invariants(manager, {"b": 20})


def test_external_computed_tokens_without_a_local_hit_may_need_no_new_tokens() -> None:
    manager = make_manager([full()], num_blocks=8)
    req = Request("a", list(range(12)))
    assert manager.allocate_slots(req, 0, num_external_computed_tokens=8) is not None
    assert len(manager.get_block_ids("a")[0]) == 2
    with pytest.raises(KVCacheRuntimeError, match="num_external_computed_tokens"):
        manager.allocate_slots(Request("b", [1]), 1, num_external_computed_tokens=-1)


def test_empty_prompt_is_an_error_unless_allowed() -> None:
    with pytest.raises(KVCacheRuntimeError, match="prompt_token_ids is empty"):
        Request("r", [])
    manager = make_manager([full()], num_blocks=9)
    req = Request("r", [], allow_empty_prompt=True)
    hit, num_hit = manager.get_computed_blocks(req)
    assert num_hit == 0
    blocks = manager.allocate_slots(req, 3, num_hit, hit, num_lookahead_tokens=2)
    assert blocks is not None and len(blocks.get_block_ids()[0]) == 2  # ceil(5 / 4)
