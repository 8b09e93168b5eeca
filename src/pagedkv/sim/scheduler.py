"""The scheduler loop: drives a KVCacheManager the way vLLM's v1 scheduler (FCFS) does.

Each step: (1) running requests, oldest first, get their next prefill chunk or one
decode token; when blocks run out the newest running request is preempted (freed,
recomputed later) and the allocation retried; (2) unless this step preempted, waiting
requests are admitted while fewer than ``max_num_seqs`` run: a fresh cache lookup, then
the first chunk (the whole sequence must fit); (3) the step "executes": computed tokens
advance, a request that reached its length samples one token, and a request with all
its output tokens is freed. Only time inside manager calls counts as manager time.
"""

from __future__ import annotations

import inspect
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from pagedkv.errors import ConfigError, PagedKVError
from pagedkv.sim.bound import AccessLog
from pagedkv.sim.metrics import SimResult, StepWriter
from pagedkv.sim.tokens import output_tokens, prompt_tokens
from pagedkv.sim.trace import Trace, TraceRequest

Arrivals = Literal["all", "timestamp"]


class SimulationError(PagedKVError, RuntimeError):
    """The replay cannot continue (for example no request can make progress)."""


@dataclass(frozen=True, kw_only=True)
class SchedulerSettings:
    """Engine knobs. Defaults follow the vLLM peer replay (K=64, 2048-token chunks,
    8192 tokens per step, all requests waiting at t=0). With ``arrivals="timestamp"`` a
    step lasts ``step_base_s + step_per_token_s * scheduled tokens`` of simulated time."""

    max_num_seqs: int = 64
    max_num_batched_tokens: int = 8192
    max_prefill_chunk: int = 2048
    arrivals: Arrivals = "all"
    step_base_s: float = 0.012
    step_per_token_s: float = 25e-6

    def __post_init__(self) -> None:
        for name in ("max_num_seqs", "max_num_batched_tokens", "max_prefill_chunk"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ConfigError(f"SchedulerSettings.{name} must be a positive integer")
        if self.arrivals not in ("all", "timestamp"):
            raise ConfigError("SchedulerSettings.arrivals must be 'all' or 'timestamp'")


class _Seq:
    __slots__ = ("admitted", "generated", "index", "logged_blocks", "out", "req", "target")

    def __init__(self, index: int, target: int) -> None:
        self.index = index
        self.target = target
        self.req: Any = None
        self.out: list[int] = []
        self.generated = 0
        self.admitted = False
        self.logged_blocks = 0


def _supports(method: Callable[..., Any], name: str) -> bool:
    try:
        return name in inspect.signature(method).parameters
    except (TypeError, ValueError):
        return False


class Simulator:
    """Replays a trace through one ``KVCacheManager`` (fresh per run; see ``engine.py``).

    ``make_request(request_id, token_ids)`` builds the runtime ``Request``;
    ``block_size`` is the manager's hash block size (for the access log and bound).
    """

    def __init__(
        self,
        manager: Any,
        *,
        make_request: Callable[[str, list[int]], Any],
        max_model_len: int,
        block_size: int,
        num_blocks: int,
        settings: SchedulerSettings | None = None,
        model_name: str = "model",
        kv_cache_groups: tuple[str, ...] = (),
    ) -> None:
        self.mgr = manager
        self.make_request = make_request
        self.max_model_len = max_model_len
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.settings = settings or SchedulerSettings()
        self.model_name = model_name
        self.kv_cache_groups = kv_cache_groups
        self._admit_kwargs: dict[str, Any] = {}
        if _supports(manager.allocate_slots, "full_sequence_must_fit"):
            self._admit_kwargs["full_sequence_must_fit"] = True
        self._pass_has_scheduled = _supports(manager.allocate_slots, "has_scheduled_reqs")
        self._new_step = getattr(manager, "new_step_starts", None)

    def run(
        self,
        trace: Trace,
        *,
        access_log: AccessLog | None = None,
        steps_path: str | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> SimResult:
        """Replay ``trace``; ``progress(requests_done)`` is called every 256 steps."""
        state = _RunState(self, trace, access_log, steps_path, progress)
        return state.run()


class _RunState:
    """Counters and queues of one run (the loop lives here to keep locals fast)."""

    def __init__(
        self,
        sim: Simulator,
        trace: Trace,
        log: AccessLog | None,
        steps_path: str | None,
        progress: Callable[[int], None] | None,
    ) -> None:
        self.sim = sim
        self.trace = trace
        self.log = log
        self.writer = StepWriter(steps_path) if steps_path else None
        self.progress = progress
        self.mgr_s = self.req_s = 0.0
        self.calls = {
            "get_computed_blocks": 0,
            "allocate_slots": 0,
            "free": 0,
            "new_step_starts": 0,
        }
        self.failed = self.preemptions = self.done = self.unservable = self.rejected = 0
        self.prompt_tokens = self.hit_tokens = self.hit_requests = self.admitted = 0
        self.readmit_tokens = self.readmit_hits = 0
        self.steps = self.peak_running = self.peak_used = 0
        self.used_sum = 0
        self.computed_tokens = 0
        self.clock_s = 0.0
        self.running: list[_Seq] = []
        self.waiting: deque[_Seq] = deque()
        self.pending: deque[_Seq] = deque()
        self.requests = trace.requests
        for index, request in enumerate(trace.requests):
            self._enqueue(index, request)

    def _enqueue(self, index: int, request: TraceRequest) -> None:
        num_prompt = request.num_prompt_tokens
        max_len = self.sim.max_model_len
        if num_prompt < 1 or num_prompt >= max_len:
            self.rejected += 1
            return
        target = max(1, min(request.num_output_tokens, max_len - num_prompt))
        self.pending.append(_Seq(index, target))

    def _arrive(self) -> None:
        pending, waiting = self.pending, self.waiting
        if self.sim.settings.arrivals == "all":
            waiting.extend(pending)
            pending.clear()
            return
        if not self.running and not waiting and pending:
            self.clock_s = max(self.clock_s, self.requests[pending[0].index].arrival_s)
        while pending and self.requests[pending[0].index].arrival_s <= self.clock_s:
            waiting.append(pending.popleft())

    def run(self) -> SimResult:
        wall0 = time.perf_counter()
        settings = self.sim.settings
        try:
            while self.pending or self.waiting or self.running:
                self._arrive()
                self.steps += 1
                self._step_starts()
                scheduled: list[tuple[_Seq, int]] = []
                budget, preempted = self._schedule_running(scheduled)
                if not preempted:
                    self._admit(scheduled, budget)
                num_tokens = sum(n for _, n in scheduled)
                self.computed_tokens += num_tokens
                self._record_step(num_tokens)
                self._execute(scheduled)
                self.clock_s += settings.step_base_s + settings.step_per_token_s * num_tokens
                if not scheduled and not self.waiting and self.running:
                    raise SimulationError("the simulation made no progress with requests running")
        finally:
            if self.writer is not None:
                self.writer.close()
        return self._result(time.perf_counter() - wall0)

    def _step_starts(self) -> None:
        new_step = self.sim._new_step
        if new_step is not None:
            t0 = time.perf_counter()
            new_step()
            self.mgr_s += time.perf_counter() - t0
            self.calls["new_step_starts"] += 1

    def _preempt(self, victim: _Seq) -> None:
        perf = time.perf_counter
        t0 = perf()
        self.sim.mgr.free(victim.req)
        self.mgr_s += perf() - t0
        self.calls["free"] += 1
        victim.req.num_computed_tokens = 0
        victim.req.num_preemptions += 1
        victim.logged_blocks = 0
        self.preemptions += 1
        self.waiting.appendleft(victim)

    def _log_insert(self, seq: _Seq, end_tokens: int) -> None:
        assert self.log is not None
        full = end_tokens // self.sim.block_size
        if full > seq.logged_blocks:
            self.log.insert(seq.index, seq.logged_blocks, full)
            seq.logged_blocks = full

    def _schedule_running(self, scheduled: list[tuple[_Seq, int]]) -> tuple[int, bool]:
        perf = time.perf_counter
        allocate = self.sim.mgr.allocate_slots
        chunk = self.sim.settings.max_prefill_chunk
        budget = self.sim.settings.max_num_batched_tokens
        running, log = self.running, self.log
        preempted = False
        mgr_s = 0.0
        calls = 0
        i = 0
        while i < len(running) and budget > 0:
            seq = running[i]
            req = seq.req
            num_new = min(req.num_tokens - req.num_computed_tokens, chunk, budget)
            if num_new <= 0:
                i += 1
                continue
            while True:
                t0 = perf()
                blocks = allocate(req, num_new)
                mgr_s += perf() - t0
                calls += 1
                if blocks is not None:
                    break
                self.failed += 1
                preempted = True
                victim = running.pop()
                self._preempt(victim)
                if victim is seq:
                    break
            if blocks is None:
                break
            if log is not None:
                self._log_insert(seq, min(req.num_computed_tokens + num_new, req.num_tokens))
            scheduled.append((seq, num_new))
            budget -= num_new
            i += 1
        self.mgr_s += mgr_s
        self.calls["allocate_slots"] += calls
        return budget, preempted

    def _build_request(self, seq: _Seq) -> None:
        perf = time.perf_counter
        t0 = perf()
        request = self.requests[seq.index]
        seq.req = self.sim.make_request(str(seq.index), prompt_tokens(request))
        seq.out = output_tokens(request)[: seq.target]
        self.req_s += perf() - t0

    def _admit(self, scheduled: list[tuple[_Seq, int]], budget: int) -> None:
        perf = time.perf_counter
        mgr = self.sim.mgr
        chunk = self.sim.settings.max_prefill_chunk
        max_seqs = self.sim.settings.max_num_seqs
        running, waiting = self.running, self.waiting
        while waiting and len(running) < max_seqs and budget > 0:
            seq = waiting[0]
            if seq.req is None:
                self._build_request(seq)
            req = seq.req
            t0 = perf()
            found = mgr.get_computed_blocks(req)
            self.mgr_s += perf() - t0
            self.calls["get_computed_blocks"] += 1
            hit_blocks, num_hit = found[0], found[1]
            num_new = min(req.num_tokens - num_hit, chunk, budget)
            if num_new <= 0:
                break
            t0 = perf()
            blocks = mgr.allocate_slots(req, num_new, num_hit, hit_blocks, **self.sim._admit_kwargs)
            self.mgr_s += perf() - t0
            self.calls["allocate_slots"] += 1
            if blocks is None:
                self.failed += 1
                if not running and not scheduled:
                    waiting.popleft()  # cannot fit even into an idle cache
                    self.unservable += 1
                    self._release_unservable(seq)
                    continue
                break
            waiting.popleft()
            self._count_admission(seq, num_hit, num_new)
            req.num_computed_tokens = num_hit
            running.append(seq)
            scheduled.append((seq, num_new))
            budget -= num_new
        self.peak_running = max(self.peak_running, len(running))

    def _release_unservable(self, seq: _Seq) -> None:
        seq.req = None
        seq.out = []

    def _count_admission(self, seq: _Seq, num_hit: int, num_new: int) -> None:
        req = seq.req
        if seq.admitted:
            self.readmit_tokens += req.num_tokens
            self.readmit_hits += num_hit
        else:
            seq.admitted = True
            self.admitted += 1
            self.prompt_tokens += req.num_prompt_tokens
            self.hit_tokens += num_hit
            self.hit_requests += num_hit > 0
            if self.log is not None:
                max_blocks = (req.num_prompt_tokens - 1) // self.sim.block_size
                self.log.lookup(seq.index, max_blocks, req.num_prompt_tokens)
        if self.log is not None:
            self._log_insert(seq, min(num_hit + num_new, req.num_tokens))

    def _execute(self, scheduled: list[tuple[_Seq, int]]) -> None:
        perf = time.perf_counter
        max_len = self.sim.max_model_len
        for seq, n in scheduled:
            req = seq.req
            req.num_computed_tokens += n
            if req.num_computed_tokens < req.num_tokens:
                continue  # a prefill chunk short of the end samples nothing
            t0 = perf()
            req.append_output_token_ids(seq.out[seq.generated])
            self.req_s += perf() - t0
            seq.generated += 1
            if seq.generated >= seq.target or req.num_tokens >= max_len:
                t0 = perf()
                self.sim.mgr.free(req)
                self.mgr_s += perf() - t0
                self.calls["free"] += 1
                self.running.remove(seq)
                seq.req = None
                self.done += 1

    def _record_step(self, num_tokens: int) -> None:
        used = self.sim.num_blocks - 1 - self.sim.mgr.num_free_blocks
        self.used_sum += used
        if used > self.peak_used:
            self.peak_used = used
        if self.writer is not None:
            self.writer.write(
                self.steps,
                round(self.clock_s, 6),
                len(self.running),
                len(self.waiting) + len(self.pending),
                num_tokens,
                used,
                self.preemptions,
                self.hit_tokens,
            )
        if self.progress is not None and self.steps % 256 == 0:
            self.progress(self.done)

    def _result(self, wall_s: float) -> SimResult:
        sim = self.sim
        return SimResult(
            model=sim.model_name,
            trace=self.trace.name,
            num_blocks=sim.num_blocks,
            block_size=sim.block_size,
            kv_cache_groups=sim.kv_cache_groups,
            requests=len(self.trace.requests),
            requests_done=self.done,
            requests_rejected_too_long=self.rejected,
            requests_unservable=self.unservable,
            prompt_tokens=self.prompt_tokens,
            hit_tokens=self.hit_tokens,
            hit_requests=self.hit_requests,
            admitted_requests=self.admitted,
            readmission_tokens=self.readmit_tokens,
            readmission_hit_tokens=self.readmit_hits,
            preemptions=self.preemptions,
            evictions=_evictions(sim.mgr),
            peak_used_blocks=self.peak_used,
            mean_used_blocks=self.used_sum / self.steps if self.steps else 0.0,
            peak_running=self.peak_running,
            steps=self.steps,
            computed_tokens=self.computed_tokens,
            manager_calls=sum(self.calls.values()),
            manager_calls_by_kind=dict(self.calls),
            allocate_slots_failed=self.failed,
            manager_seconds=self.mgr_s,
            request_seconds=self.req_s,
            wall_seconds=wall_s,
            settings=dict(vars(sim.settings)) if hasattr(sim.settings, "__dict__") else {},
        )


def _evictions(manager: Any) -> int | None:
    """Cached blocks the pool evicted to make room (None if the pool does not count them)."""
    count = getattr(getattr(manager, "block_pool", None), "num_evictions", None)
    return None if count is None else int(count)
