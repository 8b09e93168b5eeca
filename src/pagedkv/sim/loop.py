"""One replay: arrivals, the step loop and its records behind ``Simulator.run``."""

from __future__ import annotations

import dataclasses
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from pagedkv.sim.admission import Admission, Seq
from pagedkv.sim.bound import AccessLog
from pagedkv.sim.metrics import SimResult, StepWriter
from pagedkv.sim.scheduler import SimulationError
from pagedkv.sim.trace import Trace, TraceRequest

if TYPE_CHECKING:
    from pagedkv.sim.scheduler import Simulator


class RunState(Admission):
    """One run: arrivals, the step loop, execution and per-step records; admission and
    preemption come from ``Admission`` (methods on one object keep the loop's lookups
    cheap)."""

    def __init__(
        self,
        sim: Simulator,
        trace: Trace,
        log: AccessLog | None,
        steps_path: str | None,
        progress: Callable[[int], None] | None,
    ) -> None:
        super().__init__(sim, trace.requests, log)
        self.trace = trace
        self.writer = StepWriter(steps_path) if steps_path else None
        self.progress = progress
        self.done = self.rejected = 0
        self.steps = self.peak_used = 0
        self.used_sum = 0
        self.computed_tokens = 0
        self.clock_s = 0.0
        self.pending: deque[Seq] = deque()
        for index, request in enumerate(trace.requests):
            self._enqueue(index, request)

    def _enqueue(self, index: int, request: TraceRequest) -> None:
        num_prompt = request.num_prompt_tokens
        max_len = self.sim.max_model_len
        if num_prompt < 1 or num_prompt >= max_len:
            self.rejected += 1
            return
        target = max(1, min(request.num_output_tokens, max_len - num_prompt))
        self.pending.append(Seq(index, target))

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
                scheduled: list[tuple[Seq, int]] = []
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

    def _execute(self, scheduled: list[tuple[Seq, int]]) -> None:
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
            evictions=getattr(sim.mgr, "num_evictions", None),
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
            settings=dataclasses.asdict(sim.settings),
        )
