"""Admission and preemption: the waiting and running queues of one replay."""

from __future__ import annotations

import time
from collections import deque
from typing import TYPE_CHECKING, Any

from pagedkv.sim.bound import AccessLog
from pagedkv.sim.tokens import output_tokens, prompt_tokens
from pagedkv.sim.trace import TraceRequest

if TYPE_CHECKING:
    from pagedkv.sim.scheduler import Simulator


class Seq:
    __slots__ = ("admitted", "generated", "index", "logged_blocks", "out", "req", "target")

    def __init__(self, index: int, target: int) -> None:
        self.index = index
        self.target = target
        self.req: Any = None
        self.out: list[int] = []
        self.generated = 0
        self.admitted = False
        self.logged_blocks = 0


class Admission:
    """Queues, admission (lookup + allocation) and preemption of one replay; the step
    loop (``loop.RunState``) extends it. Manager calls are timed into ``mgr_s``."""

    def __init__(
        self, sim: Simulator, requests: tuple[TraceRequest, ...], log: AccessLog | None
    ) -> None:
        self.sim = sim
        self.requests = requests
        self.log = log
        self.mgr_s = self.req_s = 0.0
        self.calls = {
            "get_computed_blocks": 0,
            "allocate_slots": 0,
            "free": 0,
            "new_step_starts": 0,
        }
        self.failed = self.preemptions = self.unservable = 0
        self.prompt_tokens = self.hit_tokens = self.hit_requests = self.admitted = 0
        self.readmit_tokens = self.readmit_hits = 0
        self.peak_running = 0
        self.running: list[Seq] = []
        self.waiting: deque[Seq] = deque()

    def _preempt(self, victim: Seq) -> None:
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

    def _log_insert(self, seq: Seq, end_tokens: int) -> None:
        assert self.log is not None
        full = end_tokens // self.sim.block_size
        if full > seq.logged_blocks:
            self.log.insert(seq.index, seq.logged_blocks, full)
            seq.logged_blocks = full

    def _schedule_running(self, scheduled: list[tuple[Seq, int]]) -> tuple[int, bool]:
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

    def _build_request(self, seq: Seq) -> None:
        perf = time.perf_counter
        t0 = perf()
        request = self.requests[seq.index]
        seq.req = self.sim.make_request(str(seq.index), prompt_tokens(request))
        seq.out = output_tokens(request)[: seq.target]
        self.req_s += perf() - t0

    def _admit(self, scheduled: list[tuple[Seq, int]], budget: int) -> None:
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

    def _release_unservable(self, seq: Seq) -> None:
        seq.req = None
        seq.out = []

    def _count_admission(self, seq: Seq, num_hit: int, num_new: int) -> None:
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
