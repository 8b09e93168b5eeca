"""The clairvoyant bound is never below what the real LRU pool achieved."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pagedkv.errors import ConfigError
from pagedkv.sim.run import simulate, sweep, sweep_sizes
from pagedkv.sim.scheduling.scheduler import SchedulerSettings
from pagedkv.sim.traces.trace import Segment, Trace, TraceRequest

from .helpers import make_setup, make_trace


@st.composite
def _traces(draw):
    n = draw(st.integers(1, 12))
    requests = []
    for i in range(n):
        segments = draw(
            st.lists(st.tuples(st.integers(0, 4), st.integers(1, 12)), min_size=1, max_size=4)
        )
        out = draw(st.integers(1, 6))
        requests.append(TraceRequest(0.0, tuple(Segment(*s) for s in segments), out, -1 - i))
    return Trace("random", tuple(requests))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    trace=_traces(),
    num_blocks=st.integers(4, 40),
    max_num_seqs=st.integers(1, 4),
    chunk=st.sampled_from([3, 4, 8, 64]),
    window=st.sampled_from([None, None, 4, 7]),
)
@pytest.mark.slow
def test_bound_is_never_below_lru(trace, num_blocks, max_num_seqs, chunk, window):
    setup = make_setup(num_blocks, window=window)
    sched = SchedulerSettings(max_num_seqs=max_num_seqs, max_prefill_chunk=chunk)
    result = simulate(setup, trace, sched, bound=True)
    assert result.bound_hit_tokens is not None
    assert result.bound_hit_tokens >= result.hit_tokens
    assert result.bound_hit_tokens <= result.prompt_tokens
    assert result.bound_hit_rate is not None and result.bound_hit_rate >= result.hit_rate


def test_bound_beats_lru_when_lru_evicts_the_wrong_block():
    # 2 usable blocks. A (8 tokens) then B (8 tokens) then A again, one at a time.
    # LRU: computing B evicts both of A's blocks -> the second A misses entirely; the
    # bound never caches B (never used again) and keeps A's first block: 4 tokens hit.
    trace = make_trace((((1, 8),), 1), (((2, 8),), 1), (((1, 8),), 1))
    result = simulate(make_setup(3), trace, SchedulerSettings(max_num_seqs=1), bound=True)
    assert result.hit_tokens == 0
    assert result.bound_hit_tokens == 4


@pytest.mark.slow
def test_sweep_is_monotone_enough_and_names_sizes():
    trace = make_trace(*[(((i % 3, 16), (10 + i, 4)), 2) for i in range(12)])
    points = sweep(make_setup(64), trace, sweep_sizes(32, 2, 1), SchedulerSettings(max_num_seqs=2))
    assert [p.num_blocks for p in points] == [8, 16, 32, 64]
    assert all(p.bound_hit_rate is not None and p.bound_hit_rate >= p.hit_rate for p in points)
    assert points[-1].hit_rate >= points[0].hit_rate


def test_bound_needs_a_full_attention_group(monkeypatch):
    from pagedkv.sim import run

    monkeypatch.setattr(run, "bound_geometry", lambda cfg: None)
    with pytest.raises(ConfigError, match="full-attention"):
        simulate(make_setup(8), make_trace((((1, 4),), 1)), bound=True)


@pytest.mark.slow
def test_with_room_for_everything_lru_reaches_the_bound():
    from pagedkv.sim.traces.bundled import load_trace

    trace = load_trace("synthetic:60:5")
    setup = make_setup(20000, max_model_len=20000)
    result = simulate(setup, trace, SchedulerSettings(max_num_seqs=8), bound=True)
    assert result.preemptions == 0 and result.hit_tokens > 0
    assert result.bound_hit_tokens == result.hit_tokens
