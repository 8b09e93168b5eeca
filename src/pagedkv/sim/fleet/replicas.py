"""A fleet of replicas behind a router: each replica a real KVCacheManager with its own
engine loop, requests routed on arrival by a router that sees only the replicas' KV
events (through a ``KVIndex``), or every cache exactly (``oracle``).

Time is global: the replica whose clock is furthest behind steps next, and a request is
routed once every busy replica's clock has passed its arrival time. After each step the
replica's events go to the index, as a subscriber would apply them, so the router acts
on what the replicas published. Results are deterministic (no wall clock, no threads).
"""

from __future__ import annotations

import dataclasses
import time
from collections import deque
from typing import Any

from pagedkv.cluster import EngineLoad, KVIndex, Router, make_router
from pagedkv.cluster.routing import PrefixRouter
from pagedkv.errors import ConfigError
from pagedkv.events.wire import external_block_hash
from pagedkv.sim.fleet.result import FleetResult, ReplicaStats
from pagedkv.sim.scheduling.loop import EngineLoop
from pagedkv.sim.scheduling.scheduler import SchedulerSettings
from pagedkv.sim.setup import SimSetup
from pagedkv.sim.traces.tokens import prompt_tokens
from pagedkv.sim.traces.trace import Trace

__all__ = [
    "FLEET_ROUTERS",
    "simulate_fleet",
    "single_cache",
]

FLEET_ROUTERS = ("round-robin", "least-loaded", "prefix", "cost", "balanced", "oracle")


class _Replica:
    """One replica's loop plus what the fleet measures about it."""

    def __init__(self, setup: SimSetup, settings: SchedulerSettings, trace_name: str) -> None:
        sim = setup.simulator(settings, enable_events=True)
        self.mgr = sim.mgr
        self.loop: EngineLoop = sim.loop()
        self.loop.trace_name = trace_name
        self.usable_blocks = max(setup.num_blocks - 1, 1)
        self.running_time = 0.0  # integral of running requests over simulated time
        self.submitted_at: dict[int, int] = {}  # trace index -> replica step at arrival
        self.delays: list[int] = []

    def load(self) -> EngineLoad:
        sched = self.loop.scheduler
        used = self.usable_blocks - self.mgr.num_free_blocks
        return EngineLoad(
            len(sched.running),
            len(sched.waiting) + len(self.loop.pending),
            used / self.usable_blocks,
        )

    def step(self) -> None:
        loop = self.loop
        num_tokens = loop.step().num_scheduled_tokens
        running = loop.scheduler.running
        # this step's own duration (the clock may also have jumped to an arrival first)
        self.running_time += len(running) * loop.settings.step_seconds(num_tokens)
        if self.submitted_at:
            for seq in running:
                arrived = self.submitted_at.pop(seq.index, None)
                if arrived is not None:
                    self.delays.append(loop.steps - arrived - 1)

    def stats(self, makespan_s: float) -> ReplicaStats:
        sched = self.loop.scheduler
        return ReplicaStats(
            requests=self.loop.submitted,
            prompt_tokens=sched.prompt_tokens,
            hit_tokens=sched.hit_tokens,
            preemptions=sched.preemptions,
            steps=self.loop.steps,
            mean_running=self.running_time / makespan_s if makespan_s else 0.0,
            mean_queue_delay_steps=sum(self.delays) / len(self.delays) if self.delays else 0.0,
        )


def simulate_fleet(
    setup: SimSetup,
    trace: Trace,
    num_replicas: int,
    router: str = "round-robin",
    settings: SchedulerSettings | None = None,
    *,
    router_options: dict[str, Any] | None = None,
    bound: bool = False,
    event_delay_s: float = 0.0,
) -> FleetResult:
    """Replay ``trace`` on ``num_replicas`` copies of ``setup`` behind ``router``
    (``FLEET_ROUTERS``); arrivals follow the trace's timestamps. With ``bound``, also
    the hit rate of one cache of N times the blocks (LRU and clairvoyant bound).
    ``event_delay_s``: a step's events reach the index this much simulated time after the
    step ends (0: before the next routing decision).

    Args:
        setup: what every replica runs on.
        trace: the requests, arriving at their timestamps.
        num_replicas: engines in the fleet.
        router: the routing policy's name (``FLEET_ROUTERS``).
        settings: the scheduler settings (None: the defaults); arrivals follow timestamps.
        router_options: keyword arguments for the router (None: its defaults).
        bound: also simulate one cache of N times the blocks (LRU and clairvoyant bound).
        event_delay_s: simulated seconds between a step's end and its events reaching the index.
    """
    if not isinstance(num_replicas, int) or num_replicas < 1:
        raise ConfigError(f"fleet: replicas must be a positive integer, got {num_replicas!r}")
    if router not in FLEET_ROUTERS:
        raise ConfigError(f"unknown router {router!r}; known: {', '.join(FLEET_ROUTERS)}")
    if not event_delay_s >= 0:
        raise ConfigError(f"fleet: event_delay_s must be >= 0, got {event_delay_s!r}")
    options = dict(router_options or {})
    settings = dataclasses.replace(settings or SchedulerSettings(), arrivals="timestamp")
    policy: Router = PrefixRouter() if router == "oracle" else make_router(router, **options)
    wall0 = time.perf_counter()
    replicas = [_Replica(setup, settings, trace.name) for _ in range(num_replicas)]
    index = KVIndex() if policy.uses_cache and router != "oracle" else None
    router_state = _Routing(replicas, policy, index, router == "oracle", event_delay_s)
    order = sorted(range(len(trace.requests)), key=lambda i: trace.requests[i].arrival_s)
    next_arrival = 0
    while next_arrival < len(order) or any(r.loop.has_work for r in replicas):
        busy = [r for r in replicas if r.loop.has_work]
        arrival_s = (
            trace.requests[order[next_arrival]].arrival_s
            if next_arrival < len(order)
            else float("inf")
        )
        behind = min(busy, key=lambda r: r.loop.clock_s) if busy else None
        if behind is not None and behind.loop.clock_s < arrival_s:
            behind.step()
            router_state.publish(replicas.index(behind))
            continue
        i = order[next_arrival]
        next_arrival += 1
        router_state.route(i, trace)
    makespan = max((r.loop.clock_s for r in replicas), default=0.0)
    result = FleetResult(
        router=router,
        num_replicas=num_replicas,
        num_blocks_per_replica=setup.num_blocks,
        trace=trace.name,
        requests=len(trace.requests),
        replicas=tuple(r.stats(makespan) for r in replicas),
        max_queue_delay_steps=max((max(r.delays, default=0) for r in replicas), default=0),
        makespan_s=makespan,
        wall_seconds=time.perf_counter() - wall0,
        index_entries=len(index) if index is not None else None,
        router_options=options,
        event_delay_s=event_delay_s,
    )
    return _with_bound(result, setup, trace, settings) if bound else result


class _Routing:
    """Routes arrivals; feeds the index from the replicas' events."""

    def __init__(
        self,
        replicas: list[_Replica],
        policy: Router,
        index: KVIndex | None,
        oracle: bool,
        event_delay_s: float = 0.0,
    ) -> None:
        self.replicas = replicas
        self.event_delay_s = event_delay_s
        # per replica: (simulated time the events reach the index, events), in order
        self.in_flight: list[deque[tuple[float, list[Any]]]] = [deque() for _ in replicas]
        self.policy = policy
        self.index = index
        self.oracle = oracle
        self.names = [f"replica-{i}" for i in range(len(replicas))]
        # The replicas' own hasher (algorithm and seed), as a router hashing token ids would.
        self.hasher = replicas[0].mgr.hasher
        for name in self.names:
            if index is not None:
                index.add_engine(name)

    def publish(self, replica: int) -> None:
        events = self.replicas[replica].mgr.take_events()
        if self.index is None or not events:
            return
        if self.event_delay_s:
            ready_s = self.replicas[replica].loop.clock_s + self.event_delay_s
            self.in_flight[replica].append((ready_s, events))
        else:
            self.index.apply(self.names[replica], events, external_block_hash)

    def _deliver_until(self, now_s: float) -> None:
        assert self.index is not None
        for name, queue in zip(self.names, self.in_flight):
            while queue and queue[0][0] <= now_s:
                self.index.apply(name, queue.popleft()[1], external_block_hash)

    def route(self, trace_index: int, trace: Trace) -> None:
        request = trace.requests[trace_index]
        loads = [r.load() for r in self.replicas]
        cached = [0] * len(self.replicas)
        num_blocks = 0
        if self.policy.uses_cache:
            tokens = prompt_tokens(request)
            req = self._request(tokens)
            num_blocks = len(req.block_hashes)
            if self.oracle:
                cached = [self._exact_hit_blocks(r, req) for r in self.replicas]
            else:
                assert self.index is not None
                if self.event_delay_s:
                    self._deliver_until(request.arrival_s)
                cached = self.index.prefix_blocks(
                    [external_block_hash(h) for h in req.block_hashes]
                )
        choice = self.replicas[self.policy.choose(cached, loads, num_blocks)]
        choice.loop.submit(trace_index, request)
        if choice.loop.pending and choice.loop.pending[-1].index == trace_index:
            choice.submitted_at[trace_index] = choice.loop.steps

    def _request(self, tokens: list[int]) -> Any:
        from pagedkv.runtime import Request

        return Request("route", tokens, hasher=self.hasher)

    def _exact_hit_blocks(self, replica: _Replica, req: Any) -> int:
        _, num_hit, _ = replica.mgr.coordinator.find_longest_cache_hit(
            req.block_hashes, req.num_tokens - 1
        )
        return int(num_hit // self.hasher.block_size)


def single_cache(
    setup: SimSetup, trace: Trace, settings: SchedulerSettings, num_replicas: int
) -> tuple[float, float | None]:
    """LRU and clairvoyant-bound hit rates of one cache holding N replicas' blocks.

    Args:
        setup: what every replica runs on.
        trace: the requests replayed.
        settings: the scheduler settings.
        num_replicas: how many replicas' usable blocks the one cache holds.
    """
    from pagedkv.sim.run import simulate

    usable = (setup.num_blocks - 1) * num_replicas
    big = simulate(setup.with_num_blocks(usable + 1), trace, settings, bound=True)
    return big.hit_rate, big.bound_hit_rate


def _with_bound(
    result: FleetResult, setup: SimSetup, trace: Trace, settings: SchedulerSettings
) -> FleetResult:
    lru, best = single_cache(setup, trace, settings, result.num_replicas)
    return dataclasses.replace(result, single_cache_hit_rate=lru, bound_hit_rate=best)
