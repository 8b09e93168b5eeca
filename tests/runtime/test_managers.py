"""Per-kind managers: hit search, skipped tokens, freeing (reference section 9)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pagedkv.errors import ConfigError, KVCacheSpecError
from pagedkv.runtime import Request
from pagedkv.runtime.managers.base import leading_nulls

from .helpers import check_invariants, chunked, full, make_manager, mamba, swa


def run_prompt(manager, rid: str, tokens: list[int]) -> Request:  # type: ignore[no-untyped-def]
    """Admit, compute the whole prompt, keep the request running."""
    req = Request(rid, tokens)
    hit, num_hit = manager.get_computed_blocks(req)
    assert manager.allocate_slots(req, len(tokens) - num_hit, num_hit, hit) is not None
    req.num_computed_tokens = len(tokens)
    manager.new_step_starts()
    return req


def test_full_attention_hit_stops_one_token_short_of_the_prompt() -> None:
    manager = make_manager([full()])
    manager.free(run_prompt(manager, "a", list(range(12))))
    _, num_hit = manager.get_computed_blocks(Request("b", list(range(12))))
    assert num_hit == 8  # 3 blocks cached; the last token must be recomputed
    _, num_hit = manager.get_computed_blocks(Request("c", list(range(13))))
    assert num_hit == 12


def test_full_attention_hit_stops_at_the_first_miss() -> None:
    manager = make_manager([full()])
    req = run_prompt(manager, "a", list(range(16)))
    table = manager.get_block_ids("a")[0]
    manager.free(req)
    manager.block_pool.evict_blocks([table[1]])  # blocks 2 and 3 stay cached
    blocks, num_hit = manager.get_computed_blocks(Request("b", list(range(17))))
    assert num_hit == 4 and len(blocks.blocks[0]) == 1


def test_sliding_window_hit_needs_only_the_window_blocks() -> None:
    # window 8, block 4: a hit needs cdiv(7, 4) = 2 contiguous blocks ending at the hit.
    manager = make_manager([swa(8)], retention="dense")
    req = run_prompt(manager, "a", list(range(24)))
    table = manager.get_block_ids("a")[0]
    manager.free(req)
    pool = manager.block_pool
    pool.evict_blocks([table[0], table[1]])  # blocks outside the last window
    blocks, num_hit = manager.get_computed_blocks(Request("b", list(range(25))))
    assert num_hit == 24
    assert blocks.blocks[0][:4] == [0, 0, 0, 0] and blocks.blocks[0][4:] == table[4:6]


def test_sliding_window_run_from_block_zero_shorter_than_window_is_a_hit() -> None:
    manager = make_manager([swa(64)])
    manager.free(run_prompt(manager, "a", list(range(9))))
    blocks, num_hit = manager.get_computed_blocks(Request("b", list(range(9))))
    assert num_hit == 8 and 0 not in blocks.blocks[0]


def test_sliding_window_gap_inside_window_is_a_miss() -> None:
    manager = make_manager([swa(8)], retention="dense")
    req = run_prompt(manager, "a", list(range(16)))
    table = manager.get_block_ids("a")[0]
    manager.free(req)
    manager.block_pool.evict_blocks([table[2]])
    _, num_hit = manager.get_computed_blocks(Request("b", list(range(17))))
    assert num_hit == 8  # blocks 0-1 form a window; block 3 alone is not enough


def test_sliding_window_frees_blocks_before_the_window_as_computed_tokens_grow() -> None:
    manager = make_manager([swa(8)], num_blocks=16)
    req = Request("a", list(range(32)))
    manager.allocate_slots(req, 16)
    req.num_computed_tokens = 16
    manager.allocate_slots(req, 16)
    # skipped = 16 - 8 + 1 = 9 tokens -> blocks 0 and 1 are out of the window
    table = manager.get_block_ids("a")[0]
    assert table[:2] == [0, 0] and 0 not in table[2:]
    assert manager.managers[0].get_num_skipped_tokens(7) == 0
    assert manager.managers[0].get_num_skipped_tokens(9) == 2
    check_invariants(manager, {"a": 32})


def test_removal_of_skipped_blocks_stops_at_the_first_null() -> None:
    manager = make_manager([swa(4)], num_blocks=16)
    req = Request("a", list(range(24)))
    manager.allocate_slots(req, 24)
    sw = manager.managers[0]
    table = sw.req_to_blocks["a"]
    table_before = list(table)
    table[1] = 0  # pretend block 1 was removed earlier
    manager.block_pool.free_blocks([table_before[1]])
    sw.remove_skipped_blocks("a", 20)  # 17 tokens skipped: would remove blocks 0-3
    assert table[0] == table_before[0]  # behind the null: not touched again
    assert table[2:4] == [0, 0] and table[4] == table_before[4]


def test_chunked_local_cold_cache_hits_the_earlier_chunks_as_nulls() -> None:
    manager = make_manager([chunked(8)])
    blocks, num_hit = manager.get_computed_blocks(Request("a", list(range(21))))
    assert num_hit == 16 and blocks.blocks[0] == [0, 0, 0, 0]
    m = manager.managers[0]
    assert [m.get_num_skipped_tokens(n) for n in (7, 8, 13)] == [0, 8, 8]


def test_chunked_local_hit_extends_within_the_current_chunk() -> None:
    manager = make_manager([chunked(8)])
    manager.free(run_prompt(manager, "a", list(range(22))))
    blocks, num_hit = manager.get_computed_blocks(Request("b", list(range(22))))
    assert num_hit == 20 and blocks.blocks[0][:4] == [0, 0, 0, 0] and blocks.blocks[0][4] != 0


def test_chunked_local_null_only_hit_ends_on_a_chunk_boundary() -> None:
    # Chunk 12, block 8 (a layout vLLM never plans; its search would claim 8 null tokens):
    # block 1 covers tokens 8..15, straddling the chunk start 12; tokens 8..11 attend to
    # tokens 0..7, so a cold cache may not "hit" 8 tokens.
    manager = make_manager([chunked(12, 8)])
    blocks, num_hit = manager.get_computed_blocks(Request("a", list(range(14))))
    assert num_hit == 0 and blocks.blocks == ([],)
    # 30 tokens: nulls may cover 24 tokens (a multiple of chunk and block size).
    blocks, num_hit = manager.get_computed_blocks(Request("b", list(range(30))))
    assert num_hit == 24 and blocks.blocks[0] == [0, 0, 0]
    # Once cached, the straddling block makes a real hit of 8 + 8 tokens.
    manager.free(run_prompt(manager, "c", list(range(20))))
    blocks, num_hit = manager.get_computed_blocks(Request("d", list(range(20))))
    assert num_hit == 16 and blocks.blocks[0][0] == 0 and blocks.blocks[0][1] != 0


def test_mamba_align_table_holds_nulls_and_one_state_per_step() -> None:
    manager = make_manager([mamba()])
    req = Request("a", list(range(14)))
    new = manager.allocate_slots(req, 12)  # a chunk ending on a block boundary
    assert new is not None and new.blocks[0][:2] == [0, 0] and new.blocks[0][2] != 0
    state12 = new.blocks[0][2]
    req.num_computed_tokens = 12
    new = manager.allocate_slots(req, 2)
    assert new is not None and new.blocks[0][0] != 0 and len(new.blocks[0]) == 1
    req.num_computed_tokens = 14
    req.append_output_token_ids(99)
    manager.allocate_slots(req, 1)
    # 14 tokens computed: the state the last step read (after token 12) is freed.
    assert manager.get_block_ids("a")[0][:3] == [0, 0, 0]
    manager.free(req)
    blocks, num_hit = manager.get_computed_blocks(Request("b", list(range(14))))
    assert num_hit == 12  # the state at the prompt end (token 13 -> block 2) stayed cached
    assert blocks.blocks[0] == [0, 0, state12]


def test_mamba_checkpoint_cached_this_step_is_refused_until_written() -> None:
    manager = make_manager([mamba()])
    a = Request("a", list(range(13)))
    manager.allocate_slots(a, 12)  # caches the state at token 12, written this step
    b = Request("b", list(range(13)))
    hit, num_hit = manager.get_computed_blocks(b)
    assert num_hit == 12
    assert manager.allocate_slots(b, 1, num_hit, hit) is None  # state not written yet
    manager.new_step_starts()
    assert manager.allocate_slots(b, 1, num_hit, hit) is not None


def test_mamba_checkpoint_waits_for_the_next_step_as_in_vllm() -> None:
    # vLLM 0.33 forgets "cached this step" only at new_step_starts: neither the caching
    # request's next allocation nor its free makes the state usable earlier.
    manager = make_manager([mamba()])
    a = Request("a", list(range(13)))
    manager.allocate_slots(a, 12)
    a.num_computed_tokens = 12
    manager.allocate_slots(a, 1)
    b = Request("b", list(range(13)))
    hit, num_hit = manager.get_computed_blocks(b)
    assert num_hit == 12
    assert manager.allocate_slots(b, 1, num_hit, hit) is None
    manager.free(a)
    assert manager.allocate_slots(b, 1, num_hit, hit) is None
    manager.new_step_starts()
    assert manager.allocate_slots(b, 1, num_hit, hit) is not None


def test_mamba_none_mode_cannot_be_prefix_cached() -> None:
    with pytest.raises(ConfigError, match="cannot be prefix-cached"):
        make_manager([mamba(mode="none")], enable_caching=True)
    manager = make_manager([mamba(block_size=256, mode="none")])
    assert manager.enable_caching is False
    req = Request("a", list(range(40)))
    manager.allocate_slots(req, 40)
    assert len(manager.get_block_ids("a")[0]) == 1
    with pytest.raises(KVCacheSpecError):
        mamba(mode="all")


def test_admission_cap_applies_only_when_the_full_sequence_must_fit() -> None:
    # window 8, in-flight 64 -> cap = cdiv(min(7 + 64, 256), 4) + 1 = 19 blocks
    manager = make_manager([swa(8)], num_blocks=22)
    req = Request("a", list(range(200)))
    assert manager.managers[0].max_admission_blocks() == 19
    assert manager.allocate_slots(req, 16, full_sequence_must_fit=True) is not None
    manager.free(req)
    short = make_manager([swa(8)], num_blocks=15)
    assert short.allocate_slots(Request("a", list(range(200))), 16) is not None
    short2 = make_manager([swa(8)], num_blocks=15)
    assert (
        short2.allocate_slots(Request("a", list(range(200))), 16, full_sequence_must_fit=True)
        is None
    )


def test_mamba_align_admission_needs_one_block_per_step() -> None:
    # vLLM caps no Mamba group: an align-mode step holds one new state block.
    manager = make_manager([mamba()], num_blocks=3)
    assert manager.managers[0].max_admission_blocks() is None
    req = Request("a", list(range(200)))  # 50 blocks of tokens, never more than 2 held
    assert manager.allocate_slots(req, 16, full_sequence_must_fit=True) is not None
    assert manager.get_block_ids("a")[0][:3] == [0, 0, 0]


@given(
    run=st.integers(0, 80),
    tail=st.lists(st.booleans(), max_size=40),
    limit=st.integers(0, 130),
)
@settings(max_examples=200, deadline=None)
@pytest.mark.slow
def test_full_attention_scan_stops_exactly_at_the_first_miss(
    run: int, tail: list[bool], limit: int
) -> None:
    from pagedkv.runtime.managers.full import _leading_hits

    present = [True] * run + tail
    table = {i: 1000 + i for i, p in enumerate(present) if p}
    hashes = list(range(len(present)))
    limit = min(limit, len(hashes))
    expected = []
    for h in hashes[:limit]:
        if h not in table:
            break
        expected.append(table[h])
    assert _leading_hits(table.get, hashes, limit) == expected


@pytest.mark.parametrize(
    ("kind", "spec", "records"),
    [
        ("FullAttentionManager", full(), True),
        ("SlidingWindowManager", swa(), True),
        ("ChunkedLocalAttentionManager", chunked(), True),
        ("MambaManager", mamba(), False),
    ],
)
def test_new_blocks_are_recorded_for_zeroing_only_when_asked(
    kind: str, spec: object, records: bool
) -> None:
    from pagedkv.runtime import managers
    from pagedkv.runtime.block_pool import BlockPool

    for asked in (False, True):
        manager = getattr(managers, kind)(spec, BlockPool(16), record_new_block_ids=asked)
        manager.req_to_blocks["r"] = []
        manager.num_cached_block["r"] = 0
        real = [b for b in manager.allocate_new_blocks("r", 8, 8) if b]
        assert real and manager.records_new_block_ids is (asked and records)
        assert manager.take_new_block_ids() == (real if asked and records else [])
        assert manager.take_new_block_ids() == []


def test_a_rolled_back_allocation_unrecords_its_blocks() -> None:
    from pagedkv.runtime.block_pool import BlockPool
    from pagedkv.runtime.managers import FullAttentionManager

    pool = BlockPool(16)
    manager = FullAttentionManager(full(), pool, record_new_block_ids=True)
    manager.req_to_blocks["r"] = []
    manager.num_cached_block["r"] = 0
    first = manager.allocate_new_blocks("r", 4, 4)
    savepoint = pool.begin()
    manager.allocate_new_blocks("r", 12, 12)
    pool.rollback(savepoint)
    assert manager.take_new_block_ids() == first


def test_a_ring_buffer_never_records_blocks_for_zeroing() -> None:
    from pagedkv import CircularBufferSpec
    from pagedkv.runtime.block_pool import BlockPool
    from pagedkv.runtime.managers import CircularBufferManager

    spec = CircularBufferSpec(block_size=4, num_kv_heads=1, head_size=8)
    manager = CircularBufferManager(spec, BlockPool(8), record_new_block_ids=True)
    manager.req_to_blocks["r"] = []
    assert len(manager.allocate_new_blocks("r", 16, 16)) == 1
    assert not manager.records_new_block_ids and manager.take_new_block_ids() == []


@pytest.mark.parametrize("window", [8, 64])  # a full window found, and a run from block 0
def test_sliding_window_hit_with_hashes_and_alignment_finer_than_the_block(window: int) -> None:
    from pagedkv.runtime.block_pool import BlockPool
    from pagedkv.runtime.managers import SlidingWindowManager
    from pagedkv.runtime.managers.base import HitQuery

    pool = BlockPool(16, hash_block_size=2)
    hashes = [bytes([i]) for i in range(4)]  # every 2 tokens; a block holds 4
    pool.hash_map(0)[hashes[1]] = 10
    pool.hash_map(0)[hashes[3]] = 11
    query = HitQuery(hashes, 8, (0,), pool, swa(window), alignment_tokens=2, hash_block_size=2)
    tables, num_tokens = SlidingWindowManager.find_longest_cache_hit(query)
    assert (tables, num_tokens) == ([[10, 11]], 8)


@given(st.lists(st.sampled_from([0, 0, 1, 2, 3]), max_size=40))
def test_leading_nulls_counts_the_null_run_a_table_starts_with(table: list[int]) -> None:
    expected = next((i for i, block in enumerate(table) if block), len(table))
    assert leading_nulls(table) == expected


def test_a_freed_window_table_skips_its_null_prefix_in_order() -> None:
    manager = make_manager([full(), swa(8)], num_blocks=64)
    req = Request("a", list(range(40)))
    manager.allocate_slots(req, 40)
    manager.remove_skipped_blocks("a", 40)
    table = manager.get_block_ids("a")[1]
    skipped = leading_nulls(table)
    assert skipped == 8 and all(table[skipped:])  # 33 of 40 tokens left the window
    window = manager.managers[1]
    released: list[tuple[list[int], list[int]]] = []

    def release(request_id: str, indices: list[int], blocks: list[int], priority: int = 0) -> None:
        released.append((list(indices), list(blocks)))

    window.retention.release = release  # type: ignore[method-assign]
    manager.free(req)
    assert released == [([9, 8], table[:7:-1])]
