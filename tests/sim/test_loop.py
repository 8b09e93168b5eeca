"""The engine loop as a unit: one step at a time, several independent loops."""

from __future__ import annotations

from pagedkv.sim.scheduling.scheduler import SchedulerSettings

from .helpers import make_setup, make_trace


def test_stepping_by_hand_matches_run():
    trace = make_trace((((1, 8),), 5), (((2, 8),), 5), (((1, 8), (3, 4)), 2))
    settings = SchedulerSettings(max_num_seqs=2)
    expected = make_setup(5).simulator(settings).run(trace)
    loop = make_setup(5).simulator(settings).loop(trace)
    finished: list[int] = []
    while loop.has_work:
        outcome = loop.step()
        finished.extend(outcome.finished)
    got = loop.result(expected.wall_seconds)
    assert sorted(finished) == [0, 1, 2]
    for field in ("steps", "hit_tokens", "preemptions", "requests_done", "peak_used_blocks"):
        assert getattr(got, field) == getattr(expected, field), field


def test_independent_loops_share_nothing():
    # two replicas fed by hand: each sees only what was submitted to it
    trace = make_trace((((1, 8),), 1), (((1, 8),), 1), (((1, 8),), 1))
    loops = [make_setup(64).simulator(SchedulerSettings(max_num_seqs=1)).loop() for _ in "ab"]
    for index, request in enumerate(trace.requests):
        loops[index % 2].submit(index, request)
    while any(loop.has_work for loop in loops):
        for loop in loops:
            if loop.has_work:
                loop.step()
    first, second = (loop.result(0.0) for loop in loops)
    assert (first.requests, first.requests_done, first.hit_tokens) == (2, 2, 4)
    assert (second.requests, second.requests_done, second.hit_tokens) == (1, 1, 0)
