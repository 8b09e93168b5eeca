"""The fleet simulator: faithful to the single engine, deterministic, index-exact."""

from __future__ import annotations

import dataclasses

import pytest

from pagedkv.errors import ConfigError
from pagedkv.events.wire import external_block_hash
from pagedkv.sim.fleet.replicas import simulate_fleet
from pagedkv.sim.run import simulate
from pagedkv.sim.scheduling.scheduler import SchedulerSettings
from pagedkv.sim.traces.synthetic import SyntheticTraceConfig, synthetic_trace

from .helpers import make_setup

TRACE = synthetic_trace(
    SyntheticTraceConfig(
        num_requests=160,
        num_system_prompts=6,
        system_prompt_tokens=(24, 80),
        user_tokens=(4, 40),
        output_tokens=(2, 12),
        max_prompt_tokens=480,
        requests_per_s=40.0,
    )
)
SETTINGS = SchedulerSettings(max_num_seqs=8, max_num_batched_tokens=256, max_prefill_chunk=128)


def _setup(num_blocks: int = 160):  # type: ignore[no-untyped-def]
    return make_setup(num_blocks, max_model_len=512)


def test_one_replica_is_the_single_engine_simulation() -> None:
    single = simulate(_setup(), TRACE, dataclasses.replace(SETTINGS, arrivals="timestamp"))
    for router in ("round-robin", "prefix", "oracle"):
        fleet = simulate_fleet(_setup(), TRACE, 1, router, SETTINGS)
        (replica,) = fleet.replicas
        assert replica.hit_tokens == single.hit_tokens > 0
        assert replica.prompt_tokens == single.prompt_tokens
        assert replica.preemptions == single.preemptions and replica.steps == single.steps


def test_runs_are_deterministic_and_round_robin_splits_evenly() -> None:
    a = simulate_fleet(_setup(), TRACE, 4, "cost", SETTINGS).to_dict()
    b = simulate_fleet(_setup(), TRACE, 4, "cost", SETTINGS).to_dict()
    a.pop("wall_seconds"), b.pop("wall_seconds")
    assert a == b
    rr = simulate_fleet(_setup(), TRACE, 4, "round-robin", SETTINGS)
    assert [r.requests for r in rr.replicas] == [40] * 4
    assert rr.imbalance >= 1.0 and rr.mean_queue_delay_steps >= 0


def test_cache_aware_routing_beats_round_robin_and_matches_the_oracle() -> None:
    rr = simulate_fleet(_setup(), TRACE, 4, "round-robin", SETTINGS)
    prefix = simulate_fleet(_setup(), TRACE, 4, "prefix", SETTINGS)
    oracle = simulate_fleet(_setup(), TRACE, 4, "oracle", SETTINGS)
    assert prefix.hit_rate > rr.hit_rate
    # Events reach the index after every step, so it sees the caches as they are.
    assert abs(prefix.hit_rate - oracle.hit_rate) < 0.02
    assert prefix.index_entries and rr.index_entries is None


def test_index_equals_the_union_of_the_replicas_caches() -> None:
    from pagedkv.sim.fleet import replicas as fleet_module

    seen: dict[str, object] = {}
    original = fleet_module._Routing.__init__

    def spy(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        original(self, *args, **kwargs)
        seen["routing"] = self

    fleet_module._Routing.__init__ = spy  # type: ignore[method-assign]
    try:
        simulate_fleet(_setup(), TRACE, 3, "prefix", SETTINGS)
    finally:
        fleet_module._Routing.__init__ = original  # type: ignore[method-assign]
    routing = seen["routing"]
    for name, replica in zip(routing.names, routing.replicas):  # type: ignore[attr-defined]
        routing.publish(routing.names.index(name))  # type: ignore[attr-defined]
        cached = {external_block_hash(h) for h in replica.mgr.block_pool.block_hash if h}
        held = routing.index.engine_hashes(name)  # type: ignore[attr-defined]
        assert held.get(("GPU", 0), set()) == cached and cached


def test_bound_of_one_larger_cache_and_bad_input() -> None:
    result = simulate_fleet(_setup(), TRACE, 2, "prefix", SETTINGS, bound=True)
    assert result.bound_hit_rate is not None and result.single_cache_hit_rate is not None
    assert result.bound_hit_rate >= result.single_cache_hit_rate
    with pytest.raises(ConfigError, match="unknown router"):
        simulate_fleet(_setup(), TRACE, 2, "random")
    with pytest.raises(ConfigError, match="replicas"):
        simulate_fleet(_setup(), TRACE, 0)


@pytest.mark.slow
def test_sweep_results_do_not_depend_on_what_runs_them() -> None:
    from pagedkv.sim.fleet.sweep import fleet_sweep

    small = TRACE.head(60)
    here = fleet_sweep(_setup(), small, [1, 2], ["round-robin", "prefix"], SETTINGS, workers=1)
    pool = fleet_sweep(_setup(), small, [1, 2], ["round-robin", "prefix"], SETTINGS, workers=2)
    strip = [{k: v for k, v in r.to_dict().items() if k != "wall_seconds"} for r in here]
    assert strip == [{k: v for k, v in r.to_dict().items() if k != "wall_seconds"} for r in pool]
    assert [(r.num_replicas, r.router) for r in here] == [
        (1, "round-robin"), (1, "prefix"), (2, "round-robin"), (2, "prefix")
    ]  # fmt: skip
    assert all(r.bound_hit_rate is not None for r in here)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_sweep_on_a_local_ray_instance_gives_the_same_results() -> None:
    ray = pytest.importorskip("ray")
    from pagedkv.sim.fleet.sweep import fleet_sweep

    small = TRACE.head(40)
    args = (_setup(), small, [2], ["prefix"], SETTINGS)
    here = fleet_sweep(*args, workers=1, bound=False)
    try:
        remote = fleet_sweep(*args, ray_address="local", bound=False)
    finally:
        ray.shutdown()
    assert [r.hit_rate for r in remote] == [r.hit_rate for r in here]
    assert [r.replicas for r in remote] == [r.replicas for r in here]


@pytest.mark.slow
def test_single_engine_sweep_in_worker_processes_matches_in_process() -> None:
    from pagedkv.sim.run import sweep

    small = TRACE.head(40)
    here = sweep(_setup(), small, [40, 80], SETTINGS, workers=1)
    pool = sweep(_setup(), small, [40, 80], SETTINGS, workers=2)
    assert here == pool and [p.num_blocks for p in here] == [40, 80]


def test_late_events_cost_hits_and_never_reach_a_blind_index() -> None:
    fresh = simulate_fleet(_setup(), TRACE, 4, "prefix", SETTINGS)
    soon = simulate_fleet(_setup(), TRACE, 4, "prefix", SETTINGS, event_delay_s=0.01)
    late = simulate_fleet(_setup(), TRACE, 4, "prefix", SETTINGS, event_delay_s=1e9)
    assert late.index_entries == 0 and late.event_delay_s == 1e9
    assert soon.index_entries and late.hit_rate < soon.hit_rate <= fresh.hit_rate
    with pytest.raises(ConfigError, match="event_delay_s"):
        simulate_fleet(_setup(), TRACE, 2, "prefix", event_delay_s=-1.0)


def test_imbalance_counts_busy_time_only_not_idle_jumps_to_an_arrival() -> None:
    from pagedkv.sim.traces.trace import Segment, Trace, TraceRequest

    far_apart = Trace(
        "gaps",
        tuple(TraceRequest(100.0 * i, (Segment(i, 40),), 4, -1 - i) for i in range(4)),
    )
    result = simulate_fleet(_setup(), far_apart, 2, "round-robin", SETTINGS)
    assert [r.requests for r in result.replicas] == [2, 2]
    assert result.imbalance == pytest.approx(1.0, abs=0.05)
    assert all(r.mean_running < 0.01 for r in result.replicas)  # busy well under 1 % of the time


@pytest.mark.slow
def test_policy_sweep_in_worker_processes_matches_in_process() -> None:
    from pagedkv.sim.tiers import tier_sweep

    args = (_setup(), TRACE.head(40), SETTINGS, ["lru", "lfu"], [40, 80], [0, 30])
    here = tier_sweep(*args)
    pool = tier_sweep(*args, workers=2)
    assert here == pool and len(here) == 8
    assert [(p.num_blocks, p.host_num_blocks, p.policy) for p in here][:3] == [
        (40, 0, "lru"), (40, 0, "lfu"), (40, 30, "lru")
    ]  # fmt: skip
