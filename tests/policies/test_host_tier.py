"""The host tier: its own pool by key, and below a device pool (hash level)."""

from __future__ import annotations

import inspect
from collections.abc import Callable

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

from pagedkv import EngineConfig
from pagedkv.errors import ConfigError, KVCacheRuntimeError
from pagedkv.policies import HostTier, TieredKVCacheManager, make_kv_cache_manager
from pagedkv.runtime import BlockRemoved, KVCacheManager, Request
from runtime.helpers import check_invariants, full, kv_config, swa

BS = 4


def tiered(device_blocks: int, host_blocks: int, **kwargs: object) -> TieredKVCacheManager:
    config = EngineConfig.create(max_model_len=128, max_num_batched_tokens=128)
    manager = make_kv_cache_manager(
        kv_config([full(BS)], device_blocks, 128),
        config,
        host_num_blocks=host_blocks,
        **kwargs,  # type: ignore[arg-type]
    )
    assert isinstance(manager, TieredKVCacheManager)
    return manager


def run(manager: TieredKVCacheManager, req: Request) -> tuple[int, int]:
    """Admit, compute and finish ``req``; returns its (device, host) hit tokens."""
    hit = manager.get_computed_blocks(req)
    blocks = manager.allocate_slots(
        req, req.num_tokens - hit.num_computed_tokens, hit.num_computed_tokens, hit.blocks
    )
    assert blocks is not None
    req.num_computed_tokens = req.num_tokens
    manager.take_transfers()
    manager.free(req)
    manager.new_step_starts()
    return hit.num_device_tokens, hit.num_host_tokens


def test_host_pool_stores_loads_and_evicts_by_its_policy() -> None:
    host = HostTier(2, "lru", enable_events=True)
    plan = host.store([("a", 0), ("b", 0)])
    assert plan.keys == [("a", 0), ("b", 0)] and plan.evicted_keys == []
    assert host.lookup([("a", 0), ("b", 0), ("c", 0)]) == 2
    host.prepare_load([("a", 0)])
    host.complete_load([("a", 0)])  # a is used again: b is now least recently used
    assert host.store([("c", 0)]).evicted_keys == [("b", 0)]
    loading = host.prepare_load([("a", 0)])  # pinned while it is copied
    assert host.prepare_store([("d", 0)]).evicted_keys == [("c", 0)]
    assert host.prepare_store([("e", 0)]).keys == []  # a pinned, d being stored
    host.complete_store([("d", 0)])
    host.complete_load([("a", 0)])
    assert loading == [host.block_of[("a", 0)]]
    events = host.take_events()
    assert {e.medium for e in events} == {"CPU"}
    removed = [e.block_hashes[0] for e in events if isinstance(e, BlockRemoved)]
    assert removed == ["b", "c"]
    with pytest.raises(KVCacheRuntimeError, match="never prepared"):
        host.complete_load([("a", 0)])
    with pytest.raises(ConfigError, match=r"HostTier\.num_blocks"):
        HostTier(0)


def test_device_evictions_come_back_from_the_host() -> None:
    manager = tiered(device_blocks=7, host_blocks=16, enable_events=True)
    first = Request("a", list(range(17)))  # 4 full blocks
    assert run(manager, first) == (0, 0)
    assert run(manager, Request("b", list(range(100, 121)))) == (0, 0)  # evicts a's blocks
    device, host = run(manager, Request("a2", list(range(17))))
    assert (device, host) == (0, 16)  # served by the host: 4 blocks loaded, 0 computed
    assert manager.host_hit_tokens == 16
    media = {(type(e).__name__, e.medium) for e in manager.take_events() if hasattr(e, "medium")}
    assert ("BlockStored", "CPU") in media and ("BlockStored", "GPU") in media
    assert ("BlockRemoved", "GPU") in media


def test_transfers_pair_the_evicted_and_loaded_blocks() -> None:
    manager = tiered(device_blocks=6, host_blocks=8)
    a = Request("a", list(range(13)))  # 3 full blocks + 1 partial
    hit = manager.get_computed_blocks(a)
    manager.allocate_slots(a, 13, 0, hit.blocks)
    a_blocks = manager.get_block_ids("a")[0][:3]
    a.num_computed_tokens = 13
    manager.free(a)
    b = Request("b", list(range(50, 70)))
    manager.allocate_slots(b, 20, 0, None)  # needs every block: a's cached ones go
    stores = manager.take_transfers().stores[0]
    assert sorted(d for d, _ in stores) == sorted(a_blocks)
    b.num_computed_tokens = 20
    manager.free(b)
    manager.new_step_starts()
    again = Request("a2", list(range(13)))
    hit = manager.get_computed_blocks(again)
    assert hit.num_host_tokens == 12 and hit.num_device_tokens == 0
    manager.allocate_slots(again, 1, 12, hit.blocks)
    loads = manager.take_transfers().loads[0]
    host_of = {d: h for d, h in stores}
    assert [h for h, _ in loads] == [host_of[d] for d in a_blocks]
    assert [d for _, d in loads] == manager.get_block_ids("a2")[0][:3]


def test_a_rolled_back_eviction_is_not_stored_to_the_host(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    manager = tiered(device_blocks=6, host_blocks=8)
    a = Request("a", list(range(13)))
    manager.allocate_slots(a, 13, 0, manager.get_computed_blocks(a).blocks)
    a.num_computed_tokens = 13
    manager.free(a)
    pool = manager.manager.block_pool
    original = pool.cache_full_blocks

    def failing(*args: object, **kwargs: object) -> None:
        original(*args, **kwargs)  # type: ignore[arg-type]
        raise KVCacheRuntimeError("injected")

    monkeypatch.setattr(pool, "cache_full_blocks", failing)
    b = Request("b", list(range(50, 70)))
    with pytest.raises(KVCacheRuntimeError, match="injected"):
        manager.allocate_slots(b, 20, 0, None)  # popped a's cached blocks, then failed
    assert manager.queue.evicted == []
    monkeypatch.undo()
    manager.allocate_slots(b, 20, 0, None)
    assert len(manager.take_transfers().stores[0]) == 3


def test_allocate_slots_forwards_the_options_it_does_not_read() -> None:
    manager = tiered(10, 4, watermark=0.2)  # 2 of 10 blocks reserved for running requests
    req = Request("a", list(range(32)))
    assert manager.allocate_slots(req, 32) is None  # 8 + 2 > 9 free
    new = manager.allocate_slots(req, 28, num_lookahead_tokens=4, has_scheduled_reqs=False)
    assert new is not None and len(new.blocks[0]) == 8


def test_allocate_slots_names_the_leading_parameters_as_the_manager_does() -> None:
    def leading(method: Callable[..., object]) -> list[inspect.Parameter]:
        return list(inspect.signature(method).parameters.values())[:4]

    assert leading(TieredKVCacheManager.allocate_slots) == leading(KVCacheManager.allocate_slots)


def test_allocate_slots_shows_every_manager_keyword() -> None:
    # the simulator passes full_sequence_must_fit / has_scheduled_reqs only to a manager
    # whose signature names them: the tier must show the manager's whole signature
    manager = tiered(10, 4)
    tier_params = inspect.signature(manager.allocate_slots).parameters
    assert tier_params == inspect.signature(manager.manager.allocate_slots).parameters
    assert {"full_sequence_must_fit", "has_scheduled_reqs"} <= set(tier_params)


def test_host_tier_refuses_window_groups() -> None:
    config = EngineConfig.create(max_model_len=128)
    with pytest.raises(ConfigError, match="group 1 is 'sliding_window'"):
        make_kv_cache_manager(kv_config([full(BS), swa(8, BS)], 20, 128), config, host_num_blocks=4)


@settings(max_examples=30, deadline=None)
@given(
    ops=st.lists(st.tuples(st.integers(0, 5), st.integers(1, 30)), min_size=1, max_size=25),
    policy=st.sampled_from(["lru", "lfu", "s3fifo"]),
    host_policy=st.sampled_from(["lru", "lfu", "priority"]),
)
def test_random_traffic_keeps_both_tiers_consistent(
    ops: list[tuple[int, int]], policy: str, host_policy: str
) -> None:
    manager = tiered(10, 6, policy=policy, host_policy=host_policy)
    host = manager.host
    for n, (prefix, length) in enumerate(ops):
        tokens = [prefix] * 8 + list(range(length))
        req = Request(f"r{n}", tokens)
        hit = manager.get_computed_blocks(req)
        assert hit.num_computed_tokens < req.num_tokens
        blocks = manager.allocate_slots(
            req, req.num_tokens - hit.num_computed_tokens, hit.num_computed_tokens, hit.blocks
        )
        if blocks is not None:
            req.num_computed_tokens = req.num_tokens
            check_invariants(manager.manager, {req.request_id: req.num_tokens})
            manager.free(req)
        manager.new_step_starts()
        check_invariants(manager.manager, {})
        assert sum(host.pins) == 0
        assert {host.block_of[k]: k for k in host.block_of} == {
            b: k for b, k in enumerate(host.key_of) if k is not None
        }
        assert len(host.queue) == host.num_blocks  # nothing pinned between steps


def test_no_host_hit_without_prefix_caching() -> None:
    manager = tiered(8, 4, enable_caching=False)
    req = Request("a", list(range(30)))
    hit = manager.get_computed_blocks(req)
    assert (hit.num_computed_tokens, hit.num_host_tokens) == (0, 0)


def test_a_host_hit_lost_before_allocation_is_refused_and_leaks_nothing() -> None:
    manager = tiered(device_blocks=7, host_blocks=4)
    run(manager, Request("a", list(range(17))))
    run(manager, Request("b", list(range(100, 121))))  # a's 4 blocks go to the host
    again = Request("a2", list(range(17)))
    hit = manager.get_computed_blocks(again)
    assert hit.num_host_tokens == 16
    free_before = manager.block_pool.get_num_free_blocks()
    manager.host.store([("x", 0), ("y", 0)])  # the host drops two of a's blocks
    blocks = manager.allocate_slots(again, 1, hit.num_computed_tokens, hit.blocks)
    assert blocks is None
    assert manager.block_pool.get_num_free_blocks() == free_before
    assert manager.take_transfers() == ({}, {})
    check_invariants(manager.manager, {})
    assert sum(manager.host.pins) == 0
    hit = manager.get_computed_blocks(again)  # a fresh lookup sees what is left
    assert hit.num_host_tokens < 16


def test_free_drops_a_host_hit_never_allocated() -> None:
    manager = tiered(device_blocks=7, host_blocks=8)
    run(manager, Request("a", list(range(17))))
    run(manager, Request("b", list(range(100, 121))))
    waiting = Request("w", list(range(17)))
    assert manager.get_computed_blocks(waiting).num_host_tokens == 16
    manager.free(waiting)  # aborted before it was scheduled
    assert manager._pending == {}
    check_invariants(manager.manager, {})
