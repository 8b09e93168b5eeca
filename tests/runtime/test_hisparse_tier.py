"""HiSparse's host tier: write-back planning, worker completions, durable-prefix
publication, imports, row mirrors and residency updates; a stateful test keeps the pool's
reference counts equal to the tables' plus the in-flight transfers' pins."""

from __future__ import annotations

from collections import Counter

import hypothesis.strategies as st
import pytest
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from pagedkv import (
    EngineConfig,
    FullAttentionSpec,
    HiSparseHotSpec,
    HiSparseResidentSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheManager,
)
from pagedkv.errors import KVCacheRuntimeError
from pagedkv.runtime import Request
from pagedkv.runtime.events import BlockStored
from pagedkv.runtime.hisparse import (
    HOST_MEDIUM,
    HiSparseTier,
    HostBlockPool,
    bind_hisparse_tier,
    mirror_window,
)
from pagedkv.runtime.managers.hisparse import HISPARSE_SOURCE_ROLE, HiSparseSourceManager

BS = 4  # tokens per page


def _config(num_blocks: int) -> KVCacheConfig:
    source = FullAttentionSpec(block_size=BS, num_kv_heads=1, head_size=8)
    groups = (
        KVCacheGroupSpec(layer_names=("source",), kv_cache_spec=source, role=HISPARSE_SOURCE_ROLE),
        KVCacheGroupSpec(layer_names=("indexer",), kv_cache_spec=source),
        KVCacheGroupSpec(
            layer_names=("resident",),
            kv_cache_spec=HiSparseResidentSpec(block_size=BS, page_size=64),
        ),
        KVCacheGroupSpec(
            layer_names=("hot",),
            kv_cache_spec=HiSparseHotSpec(block_size=BS, page_size=64, blocks_per_request=2),
        ),
    )
    return KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=(), kv_cache_groups=groups)


def make_manager(
    num_blocks: int = 48,
    *,
    max_model_len: int = 64,
    num_prefill_lookahead: int = 0,
    enable_caching: bool = True,
    enable_events: bool = False,
) -> KVCacheManager:
    config = EngineConfig.create(max_model_len=max_model_len, max_num_batched_tokens=64)
    return KVCacheManager(
        _config(num_blocks),
        config,
        enable_caching=enable_caching,
        num_prefill_lookahead=num_prefill_lookahead,
        enable_events=enable_events,
    )


def schedule(
    manager: KVCacheManager, tier: HiSparseTier, request: Request, num_tokens: int
) -> None:
    """Allocate one step and run the tier's per-step work for it."""
    assert manager.allocate_slots(request, num_tokens) is not None
    tier.advance_scheduled([(request.request_id, request.num_computed_tokens + num_tokens)])
    request.num_computed_tokens += num_tokens


def ack_all(tier: HiSparseTier, workers: int = 1) -> None:
    counts = {t.transfer_id: workers for t in tier.build_offload_command().page_transfers}
    tier.update_spills(counts, counts)


def test_bind_hisparse_tier_binds_once_and_requires_a_source_group() -> None:
    manager = make_manager()
    tier = bind_hisparse_tier(manager)
    assert bind_hisparse_tier(manager) is tier
    assert isinstance(tier.host_manager, HiSparseSourceManager)
    assert tier.max_spill_pages == 64 // BS
    assert tier.transition_watermark == max(2, 48 // 10)
    plain = KVCacheManager(
        KVCacheConfig(
            num_blocks=8,
            kv_cache_tensors=(),
            kv_cache_groups=(
                KVCacheGroupSpec(
                    layer_names=("a",),
                    kv_cache_spec=FullAttentionSpec(block_size=BS, num_kv_heads=1, head_size=8),
                ),
            ),
        ),
        EngineConfig.create(max_model_len=64, max_num_batched_tokens=64),
    )
    with pytest.raises(KVCacheRuntimeError, match="source groups"):
        bind_hisparse_tier(plain)


def test_sealed_pages_are_written_back_once_and_published_when_durable() -> None:
    manager = make_manager()
    tier = bind_hisparse_tier(manager)
    request = Request("a", list(range(10)))
    schedule(manager, tier, request, 10)  # pages 0 and 1 sealed, page 2 partial
    transfers = tier.build_offload_command().page_transfers
    host, _, resident, _ = manager.get_block_ids("a")
    assert [(t.host_block_id, t.resident_block_ids) for t in transfers] == [
        (host[0], (resident[0],)),
        (host[1], (resident[1],)),
    ]
    assert all(t.after_forward and not t.restore for t in transfers)
    pool = manager.block_pool
    assert pool.ref_cnt[host[0]] == 2 and pool.ref_cnt[resident[0]] == 2
    tier.advance_scheduled([("a", 10)])  # nothing new to plan while in flight
    assert not tier.build_offload_command().page_transfers

    probe = Request("probe", list(range(12)))
    assert manager.get_computed_blocks(probe)[1] == 0  # nothing durable yet
    # Page 1 completes first: the prefix has a hole, so nothing publishes.
    tier.update_spills({transfers[1].transfer_id: 1}, {transfers[1].transfer_id: 1})
    assert tier.request_states["a"].ready_prefix_pages == 0
    assert manager.get_computed_blocks(probe)[1] == 0
    tier.update_spills({transfers[0].transfer_id: 1}, {transfers[0].transfer_id: 1})
    assert tier.request_states["a"].ready_prefix_pages == 2
    assert manager.get_computed_blocks(probe)[1] == 2 * BS
    assert pool.ref_cnt[host[0]] == 1 and pool.ref_cnt[resident[0]] == 1
    assert not tier.has_pending_work()


def test_a_transfer_completes_only_when_every_worker_has_run_it() -> None:
    manager = make_manager()
    tier = bind_hisparse_tier(manager)
    schedule(manager, tier, Request("a", list(range(4))), 4)
    [transfer] = tier.build_offload_command().page_transfers
    tier.update_spills({transfer.transfer_id: 2}, {transfer.transfer_id: 1})
    assert tier.has_pending_work() and 0 not in tier.request_states["a"].valid_pages
    tier.update_spills({transfer.transfer_id: 5}, {transfer.transfer_id: 1})  # first count holds
    assert not tier.has_pending_work() and tier.request_states["a"].valid_pages == {0}


def test_reprefillable_tokens_are_not_written_back() -> None:
    manager = make_manager(num_prefill_lookahead=3)  # the last 2 tokens are recomputed
    tier = bind_hisparse_tier(manager)
    schedule(manager, tier, Request("a", list(range(2 * BS))), 2 * BS)
    assert len(tier.build_offload_command().page_transfers) == 1


def test_the_step_budget_caps_planned_transfers() -> None:
    manager = make_manager()
    tier = bind_hisparse_tier(manager)
    tier.max_spill_pages = 1
    request = Request("a", list(range(2 * BS)))
    schedule(manager, tier, request, 2 * BS)
    first = tier.build_offload_command().page_transfers
    tier.plan_prefix_materialization("a", 2 * BS)
    second = tier.build_offload_command().page_transfers
    assert len(first) == len(second) == 1
    assert first[0].transfer_id != second[0].transfer_id


def test_row_mirrors_split_at_page_boundaries() -> None:
    manager = make_manager()
    tier = bind_hisparse_tier(manager)
    schedule(manager, tier, Request("a", list(range(2 * BS))), 2 * BS)
    host, _, resident, _ = manager.get_block_ids("a")
    mirrors = tier.build_row_mirrors([("a", BS - 1, 3)])
    assert [(m.source_starts, m.destination_start, m.num_rows) for m in mirrors] == [
        ((resident[0] * BS + BS - 1,), host[0] * BS + BS - 1, 1),
        ((resident[1] * BS,), host[1] * BS, 2),
    ]
    assert tier.build_row_mirrors([("unknown", 0, 4)]) == ()


@pytest.mark.parametrize(
    "start,count,unverified,lookahead,window",
    [
        (103, 4, 3, 4, (100, 11)),
        (103, 4, 1, 4, (102, 9)),
        (2, 1, 5, 0, (0, 3)),
        (5, 2, 0, 0, (5, 2)),
    ],
)
def test_mirror_window_covers_unverified_drafts_and_draft_kv(
    start: int, count: int, unverified: int, lookahead: int, window: tuple[int, int]
) -> None:
    assert mirror_window(start, count, unverified, lookahead) == window


def test_residency_updates_send_new_pages_and_start_over_after_readmission() -> None:
    manager = make_manager()
    tier = bind_hisparse_tier(manager)
    request = Request("a", list(range(3 * BS)))
    schedule(manager, tier, request, 2 * BS)
    first = tier.take_residency_updates(["a"])["a"]
    assert first.pages == [0, 1]
    assert first.block_ids == (manager.get_block_ids("a")[2],)
    assert tier.take_residency_updates(["a"]) == {}
    schedule(manager, tier, request, BS)
    assert tier.take_residency_updates(["a"])["a"].pages == [2]
    manager.free(request)
    request.num_computed_tokens = 0
    schedule(manager, tier, request, 3 * BS)
    assert tier.take_residency_updates(["a"])["a"].pages == [0, 1, 2]


def test_host_prefix_hits_are_clean_and_not_gpu_resident() -> None:
    manager = make_manager()
    tier = bind_hisparse_tier(manager)
    original = Request("a", list(range(3 * BS)))
    schedule(manager, tier, original, 3 * BS)
    ack_all(tier)
    manager.free(original)
    assert "a" not in tier.request_states

    resumed = Request("b", list(range(3 * BS)))
    hit, num_hit = manager.get_computed_blocks(resumed)
    assert num_hit == 2 * BS  # the last token is recomputed
    assert manager.allocate_slots(resumed, BS, num_hit, hit) is not None
    state = tier.request_states["b"]
    assert state.valid_pages == {0, 1} and state.ready_prefix_pages == 2
    assert manager.get_block_ids("b")[2][:2] == [0, 0]  # read from the host
    assert not tier.all_context_pages_resident([("b", num_hit, BS)])
    assert manager.get_block_ids("b")[3]  # the hot region came with the host prefix
    tier.advance_scheduled([("b", 3 * BS)])
    [transfer] = tier.build_offload_command().page_transfers  # only the new page
    assert transfer.resident_block_ids == (manager.get_block_ids("b")[2][2],)


def test_import_completion_restores_the_tail_page_and_ignores_an_unsealed_one() -> None:
    manager = make_manager()
    tier = bind_hisparse_tier(manager)
    request = Request("a", list(range(2 * BS + 1)))
    schedule(manager, tier, request, 2 * BS + 1)
    tier.build_offload_command()  # the write-backs of pages 0-1
    tier.record_pending_host_import("a", 2 * BS + 1)
    tier.finish_host_import("a", failed=True)
    assert tier.request_states["a"].ready_prefix_pages == 0
    tier.record_pending_host_import("a", 2 * BS + 1)
    tier.finish_host_import("a", failed=False)
    state = tier.request_states["a"]
    assert state.valid_pages == {0, 1} and state.ready_prefix_pages == 2
    [restore] = tier.build_offload_command().page_transfers
    assert restore.restore and not restore.after_forward
    assert restore.resident_block_ids == (manager.get_block_ids("a")[2][2],)


def test_in_flight_transfers_keep_their_blocks_after_free() -> None:
    manager = make_manager()
    tier = bind_hisparse_tier(manager)
    pool = manager.block_pool
    free_before = pool.num_free_blocks
    request = Request("a", list(range(BS)))
    schedule(manager, tier, request, BS)
    [transfer] = tier.build_offload_command().page_transfers
    manager.free(request)
    assert pool.ref_cnt[transfer.host_block_id] == 1
    tier.update_spills({transfer.transfer_id: 1}, {transfer.transfer_id: 1})
    assert pool.ref_cnt[transfer.host_block_id] == 0
    assert pool.num_free_blocks == free_before
    # A detached request's write-back publishes nothing.
    assert manager.get_computed_blocks(Request("probe", list(range(2 * BS))))[1] == 0


def test_pending_reclamation_is_a_transfer_whose_completion_frees_blocks() -> None:
    manager = make_manager()
    tier = bind_hisparse_tier(manager)
    request = Request("a", list(range(BS)))
    schedule(manager, tier, request, BS)
    [transfer] = tier.build_offload_command().page_transfers
    # The live request still holds its GPU page and does not read from the host.
    assert tier.has_pending_work() and not tier.has_pending_reclamation()
    manager.free(request)  # the transfer now holds the host block alone
    assert tier.has_pending_reclamation()
    tier.update_spills({transfer.transfer_id: 1}, {transfer.transfer_id: 1})
    assert not tier.has_pending_reclamation()


@pytest.mark.parametrize("finished", [True, False])
def test_a_finished_request_publishes_its_durable_prefix_after_free(finished: bool) -> None:
    manager = make_manager()
    tier = bind_hisparse_tier(manager)
    request = Request("a", list(range(2 * BS + 1)))
    schedule(manager, tier, request, 2 * BS + 1)
    host = manager.get_block_ids("a")[0]
    counts = {t.transfer_id: 1 for t in tier.build_offload_command().page_transfers}
    if finished:
        tier.mark_finished("a")
    manager.free(request)
    pool = manager.block_pool
    assert [pool.ref_cnt[b] for b in host] == ([2, 2, 0] if finished else [1, 1, 0])
    tier.update_spills(counts, counts)
    cached = [pool.block_hash[b] is not None for b in host]
    assert cached == ([True, True, False] if finished else [False] * 3)
    assert all(pool.ref_cnt[b] == 0 for b in host)
    assert not tier.has_pending_work()


def test_a_request_asks_for_its_hot_region_when_the_pool_runs_low() -> None:
    manager = make_manager(num_blocks=20)
    tier = bind_hisparse_tier(manager)
    hot = tier.hot_managers[0]
    request = Request("a", list(range(4 * BS)))
    schedule(manager, tier, request, BS)
    assert "a" not in hot.hot_required
    manager.block_pool.get_new_blocks(manager.block_pool.num_free_blocks - 1)
    tier.update_residency("a")
    assert "a" in hot.hot_required
    assert manager.allocate_slots(request, 1) is None  # no room for the hot region yet


def test_a_host_pool_backs_the_source_group_and_shares_events_and_transactions() -> None:
    manager = make_manager(num_blocks=32, enable_events=True)
    tier = bind_hisparse_tier(manager, host_num_blocks=5)  # the null block and 4 pages
    host_pool = tier.host_pool
    assert isinstance(host_pool, HostBlockPool) and host_pool.num_blocks == 5
    assert tier.gpu_pool is manager.block_pool and host_pool is not manager.block_pool
    request = Request("a", list(range(2 * BS)))
    gpu_free = manager.block_pool.num_free_blocks
    schedule(manager, tier, request, 2 * BS)
    assert host_pool.num_free_blocks == 2
    assert manager.block_pool.num_free_blocks == gpu_free - 4  # indexer and resident only
    # Admission asks the host pool: three more pages do not fit in two host blocks.
    assert manager.allocate_slots(Request("b", list(range(3 * BS))), 3 * BS) is None
    ack_all(tier)
    stored = [e for e in manager.take_events() if isinstance(e, BlockStored)]
    assert {(e.group_idx, e.medium) for e in stored} == {(0, HOST_MEDIUM), (1, "GPU")}
    manager.free(request)
    hit, num_hit = manager.get_computed_blocks(Request("c", list(range(2 * BS + 1))))
    assert num_hit == 2 * BS and all(host_pool.block_hash[b] is not None for b in hit.blocks[0])


@pytest.mark.parametrize(
    ("evictable", "local_tokens", "expected"),
    [(False, BS, 1), (True, BS, 2), (False, BS - 1, 2)],
)
def test_host_capacity_counts_evictable_hits_and_the_copy_of_a_partial_local_hit(
    evictable: bool, local_tokens: int, expected: int
) -> None:
    manager = make_manager(num_blocks=32)
    tier = bind_hisparse_tier(manager, host_num_blocks=8)
    hit = tier.host_pool.get_new_blocks(1)[0]
    if evictable:
        tier.host_pool.free_blocks([hit])
    free_before = tier.host_pool.num_free_blocks
    # A one-page hit, then a KV connector loads the second page.
    needed = tier.host_manager.get_num_host_blocks_to_allocate(
        "waiting", 2 * BS, [hit], 2 * BS, local_tokens, 2 * BS
    )
    assert needed == expected
    assert tier.host_pool.num_free_blocks == free_before
    assert "waiting" not in tier.host_manager.req_to_blocks


def test_a_failed_allocation_undoes_host_pool_changes_too() -> None:
    manager = make_manager(num_blocks=32)
    tier = bind_hisparse_tier(manager, host_num_blocks=8)
    resident = tier.resident_managers[0]
    original = resident.allocate_new_blocks

    def fail(*args: object) -> list[int]:
        raise RuntimeError("injected")

    resident.allocate_new_blocks = fail  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="injected"):
        manager.allocate_slots(Request("a", list(range(2 * BS))), 2 * BS)
    resident.allocate_new_blocks = original  # type: ignore[method-assign]
    assert tier.host_pool.num_free_blocks == 7
    assert "a" not in tier.host_manager.req_to_blocks


def test_host_copy_on_write_pairs_go_to_the_tier_not_the_gpu_copy_queue() -> None:
    manager = make_manager()
    tier = bind_hisparse_tier(manager, host_num_blocks=8)
    source, copy = tier.host_pool.get_new_blocks(2)
    tier.host_manager._queue_copy(source, copy)  # what a partial host hit queues
    assert manager.take_kv_cache_block_copies().copies == []
    assert tier.take_host_block_copies() == [(source, copy)]
    assert tier.has_pending_work()
    tier.release_completed_host_copies([copy, 99])
    assert tier.host_pool.ref_cnt[source] == tier.host_pool.ref_cnt[copy] == 0
    assert not tier.has_pending_work()


def test_moving_a_group_with_requests_to_a_pool_is_refused() -> None:
    manager = make_manager()
    manager.allocate_slots(Request("a", list(range(BS))), BS)
    with pytest.raises(KVCacheRuntimeError, match="holds requests"):
        bind_hisparse_tier(manager, host_num_blocks=8)


# -- stateful ---------------------------------------------------------------------------


class HiSparseTierMachine(RuleBasedStateMachine):
    """Requests step, publish, free and get their transfers acked by 1-2 workers in any
    order; the pool's references always equal the tables' plus the in-flight pins."""

    @initialize()
    def setup(self) -> None:
        self.manager = make_manager(num_blocks=64, max_model_len=32)
        self.tier = bind_hisparse_tier(self.manager)
        self.requests: dict[str, Request] = {}
        self.sent: list[int] = []
        self.workers: dict[int, int] = {}
        self.next_id = 0

    @rule(num_pages=st.integers(1, 4), prompt=st.integers(0, 2))
    def add(self, num_pages: int, prompt: int) -> None:
        rid = f"r{self.next_id}"
        self.next_id += 1
        request = Request(rid, [prompt] * (num_pages * BS + 1))
        hit, num_hit = self.manager.get_computed_blocks(request)
        if self.manager.allocate_slots(request, BS, num_hit, hit) is not None:
            request.num_computed_tokens = num_hit
            self.tier.advance_scheduled([(rid, num_hit + BS)])
            request.num_computed_tokens += BS
            self.requests[rid] = request

    @precondition(lambda self: self.requests)
    @rule(data=st.data())
    def step(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(sorted(self.requests)))
        request = self.requests[rid]
        num = min(BS, request.num_tokens - request.num_computed_tokens)
        if num <= 0 or self.manager.allocate_slots(request, num) is None:
            return
        request.num_computed_tokens += num
        self.tier.advance_scheduled([(rid, request.num_computed_tokens)])

    @precondition(lambda self: self.requests)
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(sorted(self.requests)))
        self.manager.free(self.requests.pop(rid))

    @precondition(lambda self: self.requests)
    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(sorted(self.requests)))
        self.tier.mark_finished(rid)
        self.manager.free(self.requests.pop(rid))

    @rule(workers=st.integers(1, 2))
    def send(self, workers: int) -> None:
        for transfer in self.tier.build_offload_command().page_transfers:
            self.sent.append(transfer.transfer_id)
            self.workers[transfer.transfer_id] = workers
            self.tier.update_spills({transfer.transfer_id: workers}, {})

    @precondition(lambda self: self.sent)
    @rule(data=st.data())
    def complete_one(self, data: st.DataObject) -> None:
        transfer_id = data.draw(st.sampled_from(self.sent))
        self.workers[transfer_id] -= 1
        if self.workers[transfer_id] == 0:
            self.sent.remove(transfer_id)
        self.tier.update_spills({}, {transfer_id: 1})

    @invariant()
    def references_match_tables_and_pins(self) -> None:
        if not hasattr(self, "tier"):
            return
        expected: Counter[int] = Counter()
        for manager in self.manager.managers:
            for table in manager.req_to_blocks.values():
                expected.update(b for b in table if b)
        detached = {}
        for pending in self.tier.pending_spills.values():
            expected[pending.host_block] += 1
            expected.update(pending.resident_blocks)
            publication = pending.state.publication
            if publication is not None and publication.detached_blocks is not None:
                detached[id(pending.state)] = publication.detached_blocks
        for blocks in detached.values():
            expected.update(b for b in blocks if b)
        pool = self.manager.block_pool
        actual = {b: pool.ref_cnt[b] for b in range(1, pool.num_blocks) if pool.ref_cnt[b]}
        assert actual == dict(expected)
        assert pool.num_free_blocks == pool.num_blocks - 1 - len(actual)

    @invariant()
    def published_prefix_is_durable(self) -> None:
        if not hasattr(self, "tier"):
            return
        for rid, state in self.tier.request_states.items():
            assert set(range(state.ready_prefix_pages)) <= state.valid_pages
            assert state.valid_pages.isdisjoint(
                p for p, t in state.pending_pages.items() if not self.tier.pending_spills[t].restore
            )
            host = self.manager.get_block_ids(rid)[0] if rid in self.requests else []
            pool = self.manager.block_pool
            for page, block in enumerate(host):
                if pool.block_hash[block] is not None and page >= state.ready_prefix_pages:
                    # a page cached beyond the durable prefix must have come from a hit
                    assert page in state.valid_pages

    @invariant()
    def in_flight_pages_are_not_clean(self) -> None:
        if not hasattr(self, "tier"):
            return
        for pending in self.tier.pending_spills.values():
            assert pending.state.pending_pages.get(pending.page) == pending.transfer_id


TestHiSparseTierMachine = HiSparseTierMachine.TestCase
TestHiSparseTierMachine.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
