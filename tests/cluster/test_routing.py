"""Routing policies: what each one picks, and that ties spread the load."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pagedkv.cluster import EngineLoad, make_router
from pagedkv.errors import ConfigError

IDLE = [EngineLoad()] * 4


def test_round_robin_cycles_blind_to_cache() -> None:
    router = make_router("round-robin")
    assert [router.choose([9, 0, 0, 0], IDLE, 9) for _ in range(6)] == [0, 1, 2, 3, 0, 1]


def test_least_loaded_by_requests_and_by_kv_usage() -> None:
    loads = [EngineLoad(3, 1, 0.1), EngineLoad(1, 0, 0.9), EngineLoad(2, 0, 0.5)]
    assert make_router("least-loaded").choose([0, 0, 0], loads, 4) == 1
    assert make_router("least-loaded", metric="kv_usage").choose([0, 0, 0], loads, 4) == 0
    queued = [EngineLoad(1, 9), EngineLoad(2, 0)]
    assert make_router("least-loaded", metric="running").choose([0, 0], queued, 4) == 0
    assert make_router("least-loaded").choose([0, 0], queued, 4) == 1
    with pytest.raises(ConfigError, match="metric"):
        make_router("least-loaded", metric="gpu")


def test_prefix_takes_the_most_cached_and_spreads_ties() -> None:
    router = make_router("prefix")
    loads = [EngineLoad(5), EngineLoad(0), EngineLoad(0), EngineLoad(0)]
    assert router.choose([3, 1, 3, 0], loads, 4) == 2  # tie 0/2: fewer requests wins
    picks = Counter(router.choose([0, 0, 0, 0], IDLE, 4) for _ in range(40))
    assert set(picks) == {0, 1, 2, 3} and max(picks.values()) == 10


def test_cost_trades_cached_blocks_against_load() -> None:
    busy_hit = [EngineLoad(8), EngineLoad(0)]
    assert make_router("cost").choose([4, 0], busy_hit, 4) == 0  # 2*1 - 1 > 0
    assert make_router("cost", prefix_weight=0.5).choose([4, 0], busy_hit, 4) == 1
    kv = [EngineLoad(0, 0, 0.9), EngineLoad(0, 0, 0.0)]
    assert make_router("cost", kv_weight=1.0).choose([0, 0], kv, 4) == 1
    with pytest.raises(ConfigError, match="load_weight"):
        make_router("cost", load_weight=-1)


def test_unknown_router_and_option_are_clear_errors() -> None:
    with pytest.raises(ConfigError, match=r"unknown router 'random'.*round-robin"):
        make_router("random")
    with pytest.raises(ConfigError, match="router 'prefix'"):
        make_router("prefix", weight=1)


@given(
    st.lists(
        st.tuples(st.integers(0, 8), st.integers(0, 5), st.integers(0, 5), st.floats(0, 1)),
        min_size=1,
        max_size=6,
    ),
    st.sampled_from(["round-robin", "least-loaded", "prefix", "cost"]),
)
def test_every_router_picks_a_valid_engine_and_prefix_picks_a_best_one(
    engines: list[tuple[int, int, int, float]], name: str
) -> None:
    cached = [e[0] for e in engines]
    loads = [EngineLoad(e[1], e[2], e[3]) for e in engines]
    router = make_router(name)
    for _ in range(3):
        choice = router.choose(cached, loads, 8)
        assert 0 <= choice < len(engines)
        if name == "prefix":
            assert cached[choice] == max(cached)
            best = [i for i, c in enumerate(cached) if c == max(cached)]
            assert loads[choice].requests == min(loads[i].requests for i in best)
        if name == "least-loaded":
            assert loads[choice].requests == min(load.requests for load in loads)
