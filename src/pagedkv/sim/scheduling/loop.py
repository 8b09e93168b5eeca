"""One replica's engine loop: arrivals, one step at a time, and the per-step records.

``EngineLoop.step()`` is one engine step (arrive, schedule, record, apply the output,
advance the clock); ``run()`` steps until no request is left. A fleet creates one loop per
replica, ``submit``s requests to it and steps the loops itself.
"""

from __future__ import annotations

import dataclasses
import time
from collections import deque
from collections.abc import Callable
from typing import NamedTuple

from pagedkv.sim.reports.metrics import SimResult, StepWriter
from pagedkv.sim.scheduling.scheduler import Scheduler, SchedulerSettings, Seq, SimulationError
from pagedkv.sim.traces.trace import TraceRequest

__all__ = [
    "StepOutcome",
    "EngineLoop",
]


class StepOutcome(NamedTuple):
    """What one step did: tokens scheduled and the trace indices that finished."""

    num_scheduled_tokens: int
    finished: tuple[int, ...]


class EngineLoop:
    """Steps one ``Scheduler``; the loop owns arrivals, the simulated clock and records.

    Args:
        scheduler: the scheduler stepped.
        num_blocks: blocks in the cache, for usage figures.
        model_name: the model's name, for the result.
        trace_name: the trace's name, for the result.
        kv_cache_groups: a label per KV cache group, for the result.
        steps_path: a file the per-step records are written to (None: none).
        keep_steps: keep the per-step series in the result.
        progress: called with the requests done, every 256 steps.
    """

    def __init__(
        self,
        scheduler: Scheduler,
        *,
        num_blocks: int,
        model_name: str = "model",
        trace_name: str = "trace",
        kv_cache_groups: tuple[str, ...] = (),
        steps_path: str | None = None,
        keep_steps: bool = False,
        progress: Callable[[int], None] | None = None,
    ) -> None:
        self.scheduler = scheduler
        self.settings: SchedulerSettings = scheduler.settings
        self.num_blocks = num_blocks
        self.model_name = model_name
        self.trace_name = trace_name
        self.kv_cache_groups = kv_cache_groups
        self.writer = StepWriter(steps_path) if steps_path else None
        self.step_rows: list[tuple[float, ...]] | None = [] if keep_steps else None
        self.progress = progress
        self.submitted = self.done = self.rejected = 0
        self.steps = self.peak_used = 0
        self.used_sum = 0
        self.computed_tokens = 0
        self.clock_s = 0.0
        self.pending: deque[Seq] = deque()

    def submit(self, index: int, request: TraceRequest) -> None:
        """Queue trace request ``index``; one that cannot fit ``max_model_len`` is rejected."""
        self.submitted += 1
        num_prompt = request.num_prompt_tokens
        max_len = self.scheduler.max_model_len
        if num_prompt < 1 or num_prompt >= max_len:
            self.rejected += 1
            return
        target = max(1, min(request.num_output_tokens, max_len - num_prompt))
        self.pending.append(Seq(index, request, target))

    @property
    def has_work(self) -> bool:
        sched = self.scheduler
        return bool(self.pending or sched.waiting or sched.running)

    def step(self) -> StepOutcome:
        """One engine step."""
        sched, settings = self.scheduler, self.settings
        self._arrive()
        self.steps += 1
        scheduled = sched.schedule()
        num_tokens = sum(n for _, n in scheduled)
        self.computed_tokens += num_tokens
        self._record_step(num_tokens)
        finished = sched.update_from_output(scheduled)
        self.done += len(finished)
        self.clock_s += settings.step_seconds(num_tokens)
        if not scheduled and not sched.waiting and sched.running:
            raise SimulationError("the simulation made no progress with requests running")
        return StepOutcome(num_tokens, tuple(seq.index for seq in finished))

    def run(self) -> SimResult:
        """Step until every submitted request finished or was dropped."""
        wall0 = time.perf_counter()
        try:
            while self.has_work:
                self.step()
        finally:
            self.close()
        return self.result(time.perf_counter() - wall0)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None

    def _arrive(self) -> None:
        pending, waiting = self.pending, self.scheduler.waiting
        if self.settings.arrivals == "all":
            waiting.extend(pending)
            pending.clear()
            return
        if not self.scheduler.running and not waiting and pending:
            self.clock_s = max(self.clock_s, pending[0].source.arrival_s)
        while pending and pending[0].source.arrival_s <= self.clock_s:
            waiting.append(pending.popleft())

    def _record_step(self, num_tokens: int) -> None:
        sched = self.scheduler
        used = self.num_blocks - 1 - sched.mgr.num_free_blocks
        self.used_sum += used
        if used > self.peak_used:
            self.peak_used = used
        if self.writer is not None or self.step_rows is not None:
            row = (
                self.steps,
                round(self.clock_s, 6),
                len(sched.running),
                len(sched.waiting) + len(self.pending),
                num_tokens,
                used,
                sched.preemptions,
                sched.hit_tokens,
            )
            if self.writer is not None:
                self.writer.write(*row)
            if self.step_rows is not None:
                self.step_rows.append(row)
        if self.progress is not None and self.steps % 256 == 0:
            self.progress(self.done)

    def result(self, wall_s: float) -> SimResult:
        """What the loop measured so far, with ``wall_s`` as its wall time."""
        sched = self.scheduler
        return SimResult(
            model=self.model_name,
            trace=self.trace_name,
            num_blocks=self.num_blocks,
            block_size=sched.block_size,
            kv_cache_groups=self.kv_cache_groups,
            requests=self.submitted,
            requests_done=self.done,
            requests_rejected_too_long=self.rejected,
            requests_unservable=sched.unservable,
            prompt_tokens=sched.prompt_tokens,
            hit_tokens=sched.hit_tokens,
            host_hit_tokens=sched.host_hit_tokens,
            hit_requests=sched.hit_requests,
            admitted_requests=sched.admitted,
            readmission_tokens=sched.readmit_tokens,
            readmission_hit_tokens=sched.readmit_hits,
            preemptions=sched.preemptions,
            evictions=getattr(sched.mgr, "num_evictions", None),
            retention=getattr(sched.mgr, "retention", None),
            peak_used_blocks=self.peak_used,
            mean_used_blocks=self.used_sum / self.steps if self.steps else 0.0,
            peak_running=sched.peak_running,
            steps=self.steps,
            computed_tokens=self.computed_tokens,
            manager_calls=sum(sched.calls.values()),
            manager_calls_by_kind=dict(sched.calls),
            allocate_slots_failed=sched.failed,
            manager_seconds=sched.mgr_s,
            request_seconds=sched.req_s,
            wall_seconds=wall_s,
            settings=dataclasses.asdict(self.settings),
            step_rows=None if self.step_rows is None else tuple(self.step_rows),
        )
