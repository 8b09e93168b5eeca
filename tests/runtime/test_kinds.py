"""The ring buffer, R-SWA and HiSparse managers on small worked examples (the numbers in
docs/runtime.md)."""

from __future__ import annotations

import pytest

from pagedkv import (
    CircularBufferSpec,
    EngineConfig,
    HiSparseHotSpec,
    HiSparseResidentSpec,
    RSWASpec,
    SlidingWindowMLASpec,
)
from pagedkv.errors import ConfigError
from pagedkv.runtime import Request

from .helpers import check_invariants, full, make_manager, mamba


def rswa(window: int = 8) -> RSWASpec:
    return RSWASpec(block_size=4, num_kv_heads=1, head_size=8, rswa_window=window)


def ring(rows: int = 2) -> CircularBufferSpec:
    return CircularBufferSpec(block_size=rows, num_kv_heads=1, head_size=8, head_size_v=0)


def decode(manager: object, req: Request, steps: int) -> None:
    for _ in range(steps):
        req.num_computed_tokens = req.num_tokens
        req.append_output_token_ids(7)
        assert manager.allocate_slots(req, 1) is not None  # type: ignore[attr-defined]


def test_rswa_frees_the_gap_between_prompt_and_window() -> None:
    # Prompt 10 tokens (blocks 0-2), window 8, block 4. The last step computes token 30
    # with 29 computed: the window starts at 29 - 8 = 21 (block 5), so blocks 3 and 4
    # (tokens 12-19) are the gap.
    manager = make_manager([rswa(8)], num_blocks=16, enable_caching=False)
    req = Request("a", list(range(10)))
    assert manager.allocate_slots(req, 10) is not None
    decode(manager, req, 20)
    table = manager.get_block_ids("a")[0]
    assert len(table) == 8  # 30 tokens
    assert table[:3] == [1, 2, 3]  # the prompt stays
    assert table[3:5] == [0, 0]  # tokens 12-19: out of the window, freed
    assert all(table[5:])
    assert manager.num_free_blocks == 15 - 6
    check_invariants(manager)


def test_rswa_without_a_prompt_length_frees_nothing() -> None:
    manager = make_manager([rswa(4)], num_blocks=16, enable_caching=False)
    req = Request("a", list(range(4)))
    manager.allocate_slots(req, 4)
    decode(manager, req, 12)
    before = manager.get_block_ids("a")
    manager.remove_skipped_blocks("a", req.num_tokens)  # no prompt length: full attention
    assert manager.get_block_ids("a") == before
    manager.remove_skipped_blocks("a", req.num_tokens, num_prompt_tokens=4)
    assert manager.get_block_ids("a")[0][1] == 0


def test_ring_holds_one_block_for_the_request_life() -> None:
    manager = make_manager([full(), ring(2)], num_blocks=12)
    req = Request("a", list(range(9)))
    out = manager.allocate_slots(req, 9, full_sequence_must_fit=True)
    assert out is not None and out.get_block_ids() == ([1, 2, 3], [4])
    decode(manager, req, 6)
    assert manager.get_block_ids("a")[1] == [4]
    manager.free(req)
    assert manager.num_free_blocks == 11
    check_invariants(manager)


def test_a_ring_leaves_the_other_groups_caching() -> None:
    manager = make_manager([full(), ring(2)], num_blocks=12)
    assert manager.enable_caching
    assert [m.enable_caching for m in manager.managers] == [True, False]
    assert manager.hash_block_size == 4  # the ring's 2-token block is not hashed
    a = Request("a", list(range(9)))
    manager.allocate_slots(a, 9)
    b = Request("b", list(range(9)))
    hit, num_hit = manager.get_computed_blocks(b)
    assert num_hit == 8 and hit.get_block_ids() == ([1, 2], [])
    assert manager.allocate_slots(b, 1, num_hit, hit).get_block_ids() == ([5], [6])


def test_a_bounded_replay_window_leaves_the_other_groups_caching() -> None:
    # vLLM: the window is replayed on a hit, never cached; caching stays on for the rest.
    window = SlidingWindowMLASpec(block_size=4, head_size=8, sliding_window=8, bounded_replay=True)
    manager = make_manager([full(), window], num_blocks=16, enable_caching=True)
    assert manager.enable_caching
    assert [m.enable_caching for m in manager.managers] == [True, False]
    manager.allocate_slots(Request("a", list(range(17))), 17)
    hit, num_hit = manager.get_computed_blocks(Request("b", list(range(17))))
    assert num_hit == 16 and hit.get_block_ids() == ([1, 2, 3, 4], [])


def test_kinds_that_cannot_cache_still_turn_caching_off() -> None:
    assert not make_manager([full(), mamba(mode="none")]).enable_caching
    with pytest.raises(ConfigError, match="cannot be prefix-cached"):
        make_manager([mamba(mode="none")], enable_caching=True)


def test_hisparse_hot_region_only_for_a_resumed_host_prefix() -> None:
    hot = HiSparseHotSpec(block_size=4, page_size=64, blocks_per_request=3)
    resident = HiSparseResidentSpec(block_size=4, page_size=64)
    manager = make_manager([full(), hot, resident], num_blocks=20)
    cold = Request("cold", list(range(6)))
    assert manager.allocate_slots(cold, 6).get_block_ids() == ([1, 2], [], [3, 4])
    warm = Request("warm", list(range(6)))
    hit, num_hit = manager.get_computed_blocks(warm)
    assert num_hit == 4
    out = manager.allocate_slots(warm, 2, num_hit, hit)
    # Hot: 3 blocks; resident: the hit's page stays on the host (null), one new page.
    assert out.get_block_ids() == ([5], [6, 7, 8], [9])
    assert manager.get_block_ids("warm")[2] == [0, 9]
    hot_manager = manager.managers[1]
    hot_manager.require_hot("cold")
    cold.num_computed_tokens = 6
    cold.append_output_token_ids(1)
    assert manager.allocate_slots(cold, 1).get_block_ids() == ([], [10, 11, 12], [])
    check_invariants(manager)


def test_hisparse_resident_admission_is_capped_by_in_flight_tokens() -> None:
    resident = HiSparseResidentSpec(block_size=4, page_size=64)
    manager = make_manager([resident], num_blocks=20)  # 64 tokens in flight: 16 pages
    assert manager.managers[0].max_admission_blocks() == 16
    config = EngineConfig.create(max_model_len=256, max_num_batched_tokens=64)
    assert resident.max_memory_usage_bytes(config) == 16 * 64


def test_a_ring_holds_one_block_for_tokens_a_connector_loads() -> None:
    manager = make_manager([full(), ring(2)], num_blocks=12)
    req = Request("a", list(range(13)))
    out = manager.allocate_slots(req, 1, num_external_computed_tokens=12)
    assert out is not None
    assert [len(t) for t in (manager.get_block_ids("a"))] == [4, 1]
    ring_manager = manager.managers[1]
    ring_manager.allocate_external_computed_blocks("a", 40)
    assert len(manager.get_block_ids("a")[1]) == 1 and ring_manager.new_block_ids == []
    manager.free(req)
    check_invariants(manager)
