"""A simulated engine that publishes its KV events over ZeroMQ, as a vLLM engine does:
a KVCacheManager driven by the simulator's engine loop, one batch per step that changed
the cache. Point a router (``pagedkv route serve``, or another) at it to test it."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import NamedTuple

from pagedkv.events import KVEventsConfig, ZmqEventPublisher
from pagedkv.events.wire import external_block_hash
from pagedkv.runtime.events import ExternalBlockHash
from pagedkv.sim.reports.metrics import SimResult
from pagedkv.sim.scheduling.scheduler import SchedulerSettings
from pagedkv.sim.setup import SimSetup
from pagedkv.sim.traces.trace import Trace

__all__ = [
    "PublishedRun",
    "publish_replay",
]


class PublishedRun(NamedTuple):
    """The replay's result, batches published, and the external hashes cached at the end."""

    result: SimResult
    num_batches: int
    num_dropped: int
    cached_hashes: frozenset[ExternalBlockHash]


def publish_replay(
    setup: SimSetup,
    trace: Trace,
    config: KVEventsConfig,
    settings: SchedulerSettings | None = None,
    *,
    step_delay_s: float = 0.0,
    on_started: Callable[[ZmqEventPublisher], None] | None = None,
    before_close: Callable[[PublishedRun], None] | None = None,
) -> PublishedRun:
    """Replay ``trace``, publishing each step's events on ``config``'s endpoints.

    ``on_started(publisher)`` runs once the sockets are bound (to hand out the resolved
    addresses); ``before_close(run)`` runs after the last batch was sent and before the
    sockets close (a late subscriber can still replay then); ``step_delay_s`` paces the
    steps in wall time.

    Args:
        setup: what the simulated engine runs on.
        trace: the requests replayed.
        config: the event endpoints, topic and queue sizes.
        settings: the scheduler settings (None: the defaults).
        step_delay_s: wall-clock seconds slept after each step (0: no pacing).
        on_started: called with the publisher once its sockets are bound.
        before_close: called with the run's result after the last batch is sent.
    """
    sim = setup.simulator(settings, enable_events=True)
    loop = sim.loop(trace)
    with ZmqEventPublisher(config) as publisher:
        if on_started is not None:
            on_started(publisher)
        t0 = time.perf_counter()
        while loop.has_work:
            loop.step()
            events = sim.mgr.take_events()
            if events:
                publisher.publish(events)
            if step_delay_s:
                time.sleep(step_delay_s)
        result = loop.result(time.perf_counter() - t0)
        deadline = time.monotonic() + 10.0
        while publisher.num_sent + publisher.num_dropped < publisher.num_published:
            if time.monotonic() > deadline:
                break
            time.sleep(0.005)
        cached = frozenset(
            external_block_hash(h) for h in sim.mgr.block_pool.block_hash if h is not None
        )
        run = PublishedRun(result, publisher.num_published, publisher.num_dropped, cached)
        if before_close is not None:
            before_close(run)
        return run
