"""Every policy inside the real pool: the runtime's stateful invariants (no leaked or
doubly freed block, reference counts, free + used = total, hits are cached prefixes) and
exact restoration of the pool and the policy after an allocation that fails midway."""

from __future__ import annotations

from typing import Any

import hypothesis.strategies as st
import pytest
from hypothesis import settings
from hypothesis.stateful import rule

from pagedkv import EngineConfig
from pagedkv.errors import ConfigError
from pagedkv.policies import make_kv_cache_manager, policy_names
from pagedkv.policies.free_queue import PolicyFreeQueue
from pagedkv.runtime import KVCacheManager, Request
from pagedkv.runtime.free_queue import LRUFreeQueue
from runtime.helpers import cached_blocks, full, kv_config, swa
from runtime.test_stateful import MAX_MODEL_LEN, PREFIXES, KVCacheMachine

from .test_policy_state import snapshot as policy_snapshot

POLICIES = ["lru", "lfu", "priority", "s3fifo", "s3fifo-pagedkv"]


class Injected(RuntimeError):
    pass


def pool_snapshot(manager: KVCacheManager) -> Any:
    pool = manager.block_pool
    queue = pool.queue
    inner = policy_snapshot(queue) if isinstance(queue, PolicyFreeQueue) else None
    return (
        pool.queue.order(),
        list(pool.ref_cnt),
        cached_blocks(pool),
        [dict(m.req_to_blocks) for m in manager.managers],
        manager.num_evictions,
        inner,
    )


class PolicyPoolMachine(KVCacheMachine):
    policy = "lru"

    def __init__(self) -> None:
        super().__init__()
        config = EngineConfig.create(max_model_len=MAX_MODEL_LEN, max_num_batched_tokens=64)
        manager = make_kv_cache_manager(
            kv_config(self.specs(), self.num_blocks, MAX_MODEL_LEN), config, policy=self.policy
        )
        assert isinstance(manager, KVCacheManager)
        self.manager = manager

    @rule(
        prefix=st.sampled_from(PREFIXES),
        size=st.integers(1, 60),
        priority=st.integers(-2, 2),
        fail_at=st.integers(0, 2),
    )
    def failed_allocation(self, prefix: list[int], size: int, priority: int, fail_at: int) -> None:
        """An exception inside allocate_slots (after blocks were popped and hits touched)
        leaves pool and policy exactly as they were."""
        self.counter += 1
        tokens = (prefix + [3] * size)[: MAX_MODEL_LEN - 8]
        req = Request(f"x{self.counter}", tokens, priority=priority)
        hit, num_hit = self.manager.get_computed_blocks(req)
        before = pool_snapshot(self.manager)
        pool = self.manager.block_pool
        original = pool.cache_full_blocks
        calls = {"n": 0}

        def failing(*args: Any, **kwargs: Any) -> None:
            original(*args, **kwargs)
            calls["n"] += 1
            if calls["n"] > fail_at:
                raise Injected

        pool.cache_full_blocks = failing  # type: ignore[method-assign]
        try:
            self.manager.allocate_slots(req, len(tokens) - num_hit, num_hit, hit)
        except Injected:
            assert pool_snapshot(self.manager) == before
        else:
            self.manager.free(req)  # refused, or it never cached enough blocks to fail
        finally:
            del pool.cache_full_blocks


def machine(policy: str, specs: Any) -> type:
    return type(
        f"{policy}Machine", (PolicyPoolMachine,), {"policy": policy, "specs": staticmethod(specs)}
    )


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("layout", ["full", "hybrid"])
def test_policy_in_the_pool_keeps_the_invariants(policy: str, layout: str) -> None:
    specs = (lambda: [full()]) if layout == "full" else (lambda: [full(), swa(8)])
    case = machine(policy, specs).TestCase
    case.settings = settings(max_examples=15, stateful_step_count=30, deadline=None)
    case().runTest()


def test_lru_is_the_runtimes_own_queue_and_names_are_checked() -> None:
    config = EngineConfig.create(max_model_len=64)
    manager = make_kv_cache_manager(kv_config([full()], 16, 64), config)
    assert type(manager.block_pool.queue) is LRUFreeQueue
    by_config = make_kv_cache_manager(
        kv_config([full()], 16, 64), config.replace(eviction_policy="s3fifo")
    )
    assert isinstance(by_config.block_pool.queue, PolicyFreeQueue)
    with pytest.raises(ConfigError, match=r"pagedkv\.policies\.make_kv_cache_manager"):
        KVCacheManager(kv_config([full()], 16, 64), config.replace(eviction_policy="lfu"))
    with pytest.raises(ConfigError, match="unknown eviction policy 'mru'"):
        make_kv_cache_manager(kv_config([full()], 16, 64), config, policy="mru")
    assert set(POLICIES) <= set(policy_names())


def test_priority_policy_evicts_the_less_important_requests_blocks() -> None:
    config = EngineConfig.create(max_model_len=64)
    manager = make_kv_cache_manager(kv_config([full()], 7, 64), config, policy="priority")
    important = Request("a", list(range(9)), priority=-1)
    bulk = Request("b", list(range(100, 109)), priority=5)
    for req in (important, bulk):
        manager.allocate_slots(req, 9)
        req.num_computed_tokens = 9
    for req in (important, bulk):  # the important one is freed first (LRU would evict it)
        manager.free(req)
    filler = Request("c", list(range(200, 213)))
    manager.allocate_slots(filler, 13)  # 4 blocks: the 2 uncached ones, then 2 cached go
    assert manager.get_computed_blocks(Request("a2", list(range(9))))[1] == 8
    assert manager.get_computed_blocks(Request("b2", list(range(100, 109))))[1] == 0


def test_failed_allocation_rule_really_rolls_back() -> None:
    """The stateful rule's injected failure does happen after blocks were popped."""
    config = EngineConfig.create(max_model_len=64)
    manager = make_kv_cache_manager(kv_config([full()], 8, 64), config, policy="s3fifo")
    assert isinstance(manager, KVCacheManager)
    warm = Request("w", list(range(20)))
    manager.allocate_slots(warm, 20)
    manager.free(warm)
    before = pool_snapshot(manager)
    pool = manager.block_pool
    original = pool.cache_full_blocks

    def failing(*args: Any, **kwargs: Any) -> None:
        original(*args, **kwargs)
        raise Injected

    pool.cache_full_blocks = failing  # type: ignore[method-assign]
    req = Request("x", list(range(100, 120)))
    with pytest.raises(Injected):
        manager.allocate_slots(req, 20)
    assert pool_snapshot(manager) == before
    assert manager.num_evictions == 0


@pytest.mark.parametrize("policy", ["lfu", "s3fifo"])
def test_a_block_freed_without_its_hash_loses_its_hit_history(policy: str) -> None:
    # Blocks hit, then dropped from the cache while in use (evict_blocks), come back
    # uncached; their next content must not inherit the old hits.
    config = EngineConfig.create(max_model_len=64, max_num_batched_tokens=64)
    manager = make_kv_cache_manager(kv_config([full(4)], 16, 64), config, policy=policy)
    assert isinstance(manager, KVCacheManager)

    def serve(request_id: str, tokens: list[int], drop: bool = False) -> list[int]:
        req = Request(request_id, tokens)
        hit, num_hit = manager.get_computed_blocks(req)
        assert manager.allocate_slots(req, len(tokens) - num_hit, num_hit, hit) is not None
        req.num_computed_tokens = len(tokens)
        blocks = list(manager.get_block_ids(request_id)[0])
        if drop:
            manager.block_pool.evict_blocks(blocks)
        manager.free(req)
        return blocks

    serve("a", list(range(9)))
    serve("b", list(range(9)), drop=True)
    first = serve("c", list(range(100, 112)))  # reuses b's blocks, no hit since
    second = serve("d", list(range(200, 212)))
    queue = manager.block_pool.queue
    assert isinstance(queue, PolicyFreeQueue)
    assert queue.policy.order() == [*reversed(first), *reversed(second)]
