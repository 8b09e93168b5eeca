"""One replay: queues, counters and the step loop behind ``Simulator.run``."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pagedkv.sim.bound import AccessLog
from pagedkv.sim.metrics import SimResult, StepWriter
from pagedkv.sim.scheduler import SimulationError
from pagedkv.sim.tokens import output_tokens, prompt_tokens
from pagedkv.sim.trace import Trace, TraceRequest

if TYPE_CHECKING:
    from pagedkv.sim.scheduler import Simulator


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


class RunState:
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
        self.evictions = 0
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
        align = self.sim.align_block_size
        preempted = False
        mgr_s = 0.0
        calls = 0
        i = 0
        while i < len(running) and budget > 0:
            seq = running[i]
            req = seq.req
            num_new = min(req.num_tokens - req.num_computed_tokens, chunk, budget)
            if align:
                num_new = self._aligned_chunk(req, num_new, 0)
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

    def _aligned_chunk(self, req: Any, num_new: int, num_hit: int) -> int:
        """Mamba checkpoint ("align") mode: a prefill chunk that does not finish the prefill
        ends on a block boundary, and one starting mid-block stops at the next boundary
        or at the shared-prefix junction (vLLM's block-aligned split, without prefill
        checkpoints)."""
        block = self.sim.align_block_size
        start = req.num_computed_tokens + num_hit
        prefill_end = max(req.num_prompt_tokens, req.num_tokens - 1)
        if start >= prefill_end:
            return num_new
        end = start + num_new
        settings = self.sim.settings
        if end < prefill_end:
            aligned = end // block * block
            if aligned > start or block <= min(
                settings.max_num_batched_tokens, settings.max_prefill_chunk
            ):
                end = aligned
        junction = getattr(req, "shared_prefix_boundary", 0)
        stops = (
            (start // block + 1) * block if start % block else 0,
            start + (junction - start) // block * block if start < junction < end else 0,
        )
        end = min((s for s in stops if start < s < end), default=end)
        return max(end - start, 0)

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
            if self.sim.align_block_size:
                num_new = self._aligned_chunk(req, num_new, num_hit)
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

    def _count_evictions(self) -> None:
        from pagedkv.runtime.events import BlockRemoved

        for event in self.sim.mgr.take_events():
            if isinstance(event, BlockRemoved):
                self.evictions += len(event.block_hashes)

    def _record_step(self, num_tokens: int) -> None:
        if self.sim.count_evictions:
            self._count_evictions()
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
            evictions=self.evictions if sim.count_evictions else None,
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
