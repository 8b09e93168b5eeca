"""The scheduler: drives a KVCacheManager the way vLLM's v1 scheduler (FCFS) does.

Each step: (1) running requests, oldest first, get their next prefill chunk or one
decode token; when blocks run out the newest running request is preempted (freed,
recomputed later) and the allocation retried; (2) unless this step preempted, waiting
requests are admitted while fewer than ``max_num_seqs`` run: a fresh cache lookup, then
the first chunk (the whole sequence must fit); (3) ``update_from_output``: computed
tokens advance, a request that reached its length samples one token, and a request with
all its output tokens is freed. Only time inside manager calls counts as manager time.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from pagedkv.errors import ConfigError, PagedKVError
from pagedkv.sim.bound import AccessLog
from pagedkv.sim.chunking import aligned_chunk
from pagedkv.sim.tokens import output_tokens, prompt_tokens
from pagedkv.sim.trace import TraceRequest

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

    def step_seconds(self, num_tokens: int) -> float:
        """Simulated duration of a step that schedules ``num_tokens`` tokens."""
        return self.step_base_s + self.step_per_token_s * num_tokens


class Seq:
    """One trace request inside a replay; ``req`` is its runtime ``Request`` while live."""

    __slots__ = (
        "admitted", "generated", "index", "logged_blocks", "out", "req", "source", "target"
    )  # fmt: skip

    def __init__(self, index: int, source: TraceRequest, target: int) -> None:
        self.index = index
        self.source = source
        self.target = target
        self.req: Any = None
        self.out: list[int] = []
        self.generated = 0
        self.admitted = False
        self.logged_blocks = 0


Scheduled = list[tuple[Seq, int]]


class Scheduler:
    """Waiting and running queues over one manager: ``schedule()`` picks this step's
    tokens, ``update_from_output()`` applies them. Manager calls are timed into
    ``mgr_s``, request building and token appends into ``req_s``. The manager's
    ``allocate_slots`` takes vLLM's ``full_sequence_must_fit`` and ``has_scheduled_reqs``
    keywords (as ``KVCacheManager``'s does)."""

    def __init__(
        self,
        manager: Any,
        make_request: Callable[[str, list[int]], Any],
        settings: SchedulerSettings,
        *,
        max_model_len: int,
        block_size: int,
        align_block_size: int = 0,
        log: AccessLog | None = None,
    ) -> None:
        self.mgr = manager
        self.make_request = make_request
        self.settings = settings
        self.max_model_len = max_model_len
        self.block_size = block_size  # of the access log
        self.align_block_size = align_block_size  # Mamba "align" mode (0: off)
        self.log = log
        self._new_step = getattr(manager, "new_step_starts", None)
        self.mgr_s = self.req_s = 0.0
        self.calls = dict.fromkeys(
            ("get_computed_blocks", "allocate_slots", "free", "new_step_starts"), 0
        )
        self.failed = self.preemptions = self.unservable = 0
        self.prompt_tokens = self.hit_tokens = self.hit_requests = self.admitted = 0
        self.readmit_tokens = self.readmit_hits = 0
        self.host_hit_tokens = 0  # part of hit_tokens a host tier served
        self.peak_running = 0
        self.running: list[Seq] = []
        self.waiting: deque[Seq] = deque()

    def schedule(self) -> Scheduled:
        """This step's (request, number of new tokens) pairs, running ones first."""
        if self._new_step is not None:
            t0 = time.perf_counter()
            self._new_step()
            self.mgr_s += time.perf_counter() - t0
            self.calls["new_step_starts"] += 1
        scheduled: Scheduled = []
        budget, preempted = self._schedule_running(scheduled)
        if not preempted:
            self._admit(scheduled, budget)
        return scheduled

    def update_from_output(self, scheduled: Scheduled) -> list[Seq]:
        """Advance the scheduled requests; frees and returns the ones that finished."""
        perf = time.perf_counter
        max_len = self.max_model_len
        finished = []
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
                self.mgr.free(req)
                self.mgr_s += perf() - t0
                self.calls["free"] += 1
                self.running.remove(seq)
                seq.req = None
                finished.append(seq)
        return finished

    def _chunk(self, req: Any, num_new: int, num_hit: int) -> int:
        settings = self.settings
        limit = min(settings.max_num_batched_tokens, settings.max_prefill_chunk)
        return aligned_chunk(req, num_new, num_hit, self.align_block_size, limit)

    def _preempt(self, victim: Seq) -> None:
        perf = time.perf_counter
        t0 = perf()
        self.mgr.free(victim.req)
        self.mgr_s += perf() - t0
        self.calls["free"] += 1
        victim.req.num_computed_tokens = 0
        victim.req.num_preemptions += 1
        victim.logged_blocks = 0
        self.preemptions += 1
        self.waiting.appendleft(victim)

    def _log_insert(self, seq: Seq, end_tokens: int) -> None:
        assert self.log is not None
        full = end_tokens // self.block_size
        if full > seq.logged_blocks:
            self.log.insert(seq.index, seq.logged_blocks, full)
            seq.logged_blocks = full

    def _schedule_running(self, scheduled: Scheduled) -> tuple[int, bool]:
        perf = time.perf_counter
        allocate = self.mgr.allocate_slots
        chunk = self.settings.max_prefill_chunk
        budget = self.settings.max_num_batched_tokens
        running, log = self.running, self.log
        align = self.align_block_size
        preempted = False
        mgr_s = 0.0
        calls = 0
        i = 0
        while i < len(running) and budget > 0:
            seq = running[i]
            req = seq.req
            num_new = min(req.num_tokens - req.num_computed_tokens, chunk, budget)
            if align:
                num_new = self._chunk(req, num_new, 0)
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

    def _build_request(self, seq: Seq) -> None:
        t0 = time.perf_counter()
        seq.req = self.make_request(str(seq.index), prompt_tokens(seq.source))
        seq.out = output_tokens(seq.source)[: seq.target]
        self.req_s += time.perf_counter() - t0

    def _admit(self, scheduled: Scheduled, budget: int) -> None:
        perf = time.perf_counter
        mgr = self.mgr
        chunk = self.settings.max_prefill_chunk
        max_seqs = self.settings.max_num_seqs
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
            if len(found) > 2:  # vLLM's manager returns the boundary for the caller to keep
                req.shared_prefix_boundary = found[2]
            num_new = min(req.num_tokens - num_hit, chunk, budget)
            if self.align_block_size:
                num_new = self._chunk(req, num_new, num_hit)
            if num_new <= 0:
                break
            t0 = perf()
            # as vLLM 0.33's scheduler: the whole sequence must fit (scheduler_reserve_full_isl),
            # and the watermark applies only while something runs
            blocks = mgr.allocate_slots(
                req,
                num_new,
                num_hit,
                hit_blocks,
                full_sequence_must_fit=True,
                has_scheduled_reqs=bool(running),
            )
            self.mgr_s += perf() - t0
            self.calls["allocate_slots"] += 1
            if blocks is None:
                self.failed += 1
                if not running and not scheduled:
                    waiting.popleft()  # cannot fit even into an idle cache
                    self.unservable += 1
                    seq.req = None
                    seq.out = []
                    continue
                break
            waiting.popleft()
            self._count_admission(seq, num_hit, num_new, getattr(found, "num_host_tokens", 0))
            req.num_computed_tokens = num_hit
            running.append(seq)
            scheduled.append((seq, num_new))
            budget -= num_new
        self.peak_running = max(self.peak_running, len(running))

    def _count_admission(self, seq: Seq, num_hit: int, num_new: int, num_host: int = 0) -> None:
        req = seq.req
        if seq.admitted:
            self.readmit_tokens += req.num_tokens
            self.readmit_hits += num_hit
        else:
            seq.admitted = True
            self.admitted += 1
            self.host_hit_tokens += num_host
            self.prompt_tokens += req.num_prompt_tokens
            self.hit_tokens += num_hit
            self.hit_requests += num_hit > 0
            if self.log is not None:
                max_blocks = (req.num_prompt_tokens - 1) // self.block_size
                self.log.lookup(seq.index, max_blocks, req.num_prompt_tokens)
        if self.log is not None:
            self._log_insert(seq, min(num_hit + num_new, req.num_tokens))
