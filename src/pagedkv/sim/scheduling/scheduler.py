"""The scheduler: drives a KVCacheManager the way vLLM 0.33's v1 scheduler does.

Each step: (1) running requests, oldest first, get their next prefill chunk or one
decode token, as many as the step's token budget leaves (a long prefill capped at
``long_prefill_token_threshold`` while other requests are eligible); when blocks run out
a running request is preempted (freed, recomputed later; FCFS: the newest, priority: the
one of largest (priority, arrival)) and the allocation retried; (2) unless this step
preempted, waiting requests are admitted in queue order (FCFS: arrival, preempted ones
back at the front; priority: (priority, arrival, request id)) while fewer than
``max_num_seqs`` run: a fresh cache lookup, then the first chunk (the whole sequence must
fit); (3) ``update_from_output``: computed tokens advance, a request that reached its
length samples one token, and a request with all its output tokens is freed. Only time
inside manager calls counts as manager time. ``benchmarks/sched_side_by_side.py`` checks
the schedule step by step against vLLM's own ``Scheduler``.
"""

from __future__ import annotations

import heapq
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from pagedkv.errors import ConfigError, PagedKVError
from pagedkv.sim.reports.bound import AccessLog
from pagedkv.sim.scheduling.chunking import aligned_chunk
from pagedkv.sim.traces.tokens import output_tokens, prompt_tokens
from pagedkv.sim.traces.trace import TraceRequest

if TYPE_CHECKING:
    from pagedkv.deployment.options import SchedulerDefaults

__all__ = [
    "Arrivals",
    "Policy",
    "vllm_serve_defaults",
    "SimulationError",
    "SchedulerSettings",
    "Seq",
    "Scheduled",
    "WaitingQueue",
    "Scheduler",
]

Arrivals = Literal["all", "timestamp"]
Policy = Literal["fcfs", "priority"]


def vllm_serve_defaults(device_bytes: int | None, device_name: str = "") -> SchedulerDefaults:
    """``vllm serve``'s (max_num_seqs, max_num_batched_tokens) on a device of
    ``device_bytes`` total memory (vLLM 0.33's ``EngineArgs.get_batch_defaults``;
    ``pagedkv.deployment.vllm_scheduler_defaults``, which ``pagedkv plan`` uses too).

    From 160 GiB (B200 and up): 1024 and 16384; from 70 GiB except A100s and the GB10:
    1024 and 8192; anything else or an unknown device: 256 and 2048.
    """
    from pagedkv.deployment.options import vllm_scheduler_defaults

    return vllm_scheduler_defaults(device_bytes, device_name)


class SimulationError(PagedKVError, RuntimeError):
    """The replay cannot continue (for example no request can make progress)."""


@dataclass(frozen=True, kw_only=True)
class SchedulerSettings:
    """Engine knobs; the defaults are vLLM 0.33's ``vllm serve`` on an H100 (1024
    sequences, 8192 tokens per step, chunked prefill without a per-request cap, FCFS),
    with requests arriving at their trace times (``arrivals="all"``: all at t=0).
    ``vllm_serve_defaults`` gives other devices' values.

    ``long_prefill_token_threshold`` (0: off) and its ``_adaptive`` variant are vLLM's;
    ``max_prefill_chunk`` (None: off) is pagedkv's own cap on one request's tokens per
    step, applied always. A step lasts ``step_base_s + step_per_token_s * scheduled
    tokens`` of simulated time."""

    max_num_seqs: int = 1024
    max_num_batched_tokens: int = 8192
    max_prefill_chunk: int | None = None
    long_prefill_token_threshold: int = 0
    long_prefill_token_threshold_adaptive: bool = False
    policy: Policy = "fcfs"
    arrivals: Arrivals = "timestamp"
    step_base_s: float = 0.012
    step_per_token_s: float = 25e-6

    def __post_init__(self) -> None:
        for name in ("max_num_seqs", "max_num_batched_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"SchedulerSettings.{name} must be a positive integer")
        chunk = self.max_prefill_chunk
        if chunk is not None and (not isinstance(chunk, int) or chunk < 1):
            raise ConfigError("SchedulerSettings.max_prefill_chunk must be None or >= 1")
        threshold = self.long_prefill_token_threshold
        if not isinstance(threshold, int) or threshold < 0:
            raise ConfigError("SchedulerSettings.long_prefill_token_threshold must be >= 0")
        if self.arrivals not in ("all", "timestamp"):
            raise ConfigError("SchedulerSettings.arrivals must be 'all' or 'timestamp'")
        if self.policy not in ("fcfs", "priority"):
            raise ConfigError("SchedulerSettings.policy must be 'fcfs' or 'priority'")

    @property
    def chunk_cap(self) -> int:
        """The most tokens one request may take in a step, before the threshold."""
        if self.max_prefill_chunk is None:
            return self.max_num_batched_tokens
        return min(self.max_prefill_chunk, self.max_num_batched_tokens)

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

    def priority_key(self) -> tuple[int, float, str]:
        """vLLM's ``Request`` order under the priority policy (the id compares as text)."""
        return (self.source.priority, self.source.arrival_s, str(self.index))

    def __lt__(self, other: Seq) -> bool:
        return self.priority_key() < other.priority_key()


Scheduled = list[tuple[Seq, int]]


class WaitingQueue:
    """vLLM's waiting queue: FCFS (a deque; preempted requests go back to the front) or
    priority (a heap on ``Seq.priority_key``)."""

    def __init__(self, policy: Policy) -> None:
        self.by_priority = policy == "priority"
        self._fifo: deque[Seq] = deque()
        self._heap: list[Seq] = []

    def __len__(self) -> int:
        return len(self._heap) if self.by_priority else len(self._fifo)

    def __bool__(self) -> bool:
        return len(self) > 0

    def __iter__(self) -> Iterator[Seq]:
        return iter(sorted(self._heap) if self.by_priority else self._fifo)

    def append(self, seq: Seq) -> None:
        if self.by_priority:
            heapq.heappush(self._heap, seq)
        else:
            self._fifo.append(seq)

    def extend(self, seqs: Any) -> None:
        for seq in seqs:
            self.append(seq)

    def appendleft(self, seq: Seq) -> None:
        """A preempted request: first in line under FCFS, by its key under priority."""
        if self.by_priority:
            heapq.heappush(self._heap, seq)
        else:
            self._fifo.appendleft(seq)

    def peek(self) -> Seq:
        return self._heap[0] if self.by_priority else self._fifo[0]

    def popleft(self) -> Seq:
        return heapq.heappop(self._heap) if self.by_priority else self._fifo.popleft()


class Scheduler:
    """Waiting and running queues over one manager: ``schedule()`` picks this step's
    tokens, ``update_from_output()`` applies them. Manager calls are timed into
    ``mgr_s``, request building and token appends into ``req_s``. The manager's
    ``allocate_slots`` takes vLLM's ``full_sequence_must_fit`` and ``has_scheduled_reqs``
    keywords (as ``KVCacheManager``'s does).

    Args:
        manager: the KV cache manager scheduled over.
        make_request: builds the runtime request from an id and token ids.
        settings: the scheduler settings (budgets, policy).
        max_model_len: the longest sequence in tokens.
        block_size: tokens per block of the access log.
        align_block_size: Mamba "align" mode's block size in tokens (0: off).
        log: records lookups and insertions for the bound (None: none).
    """

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
        self.waiting = WaitingQueue(settings.policy)
        self.on_preempt: Callable[[Seq], None] | None = None  # a step recorder's hook

    def schedule(self) -> Scheduled:
        """This step's (request, number of new tokens) pairs, running ones first."""
        if self._new_step is not None:
            t0 = time.perf_counter()
            self._new_step()
            self.mgr_s += time.perf_counter() - t0
            self.calls["new_step_starts"] += 1
        scheduled: Scheduled = []
        threshold = self._long_prefill_threshold()
        budget, preempted = self._schedule_running(scheduled, threshold)
        if not preempted:
            self._admit(scheduled, budget, threshold)
        return scheduled

    def _long_prefill_threshold(self) -> int:
        """This step's cap on one request's tokens (0: none): vLLM's threshold, which
        applies only while another request (running or waiting) could use the budget."""
        settings = self.settings
        eligible = len(self.running) + len(self.waiting)
        threshold = settings.long_prefill_token_threshold if eligible > 1 else 0
        if threshold > 0 and settings.long_prefill_token_threshold_adaptive:
            threshold = max(threshold, settings.max_num_batched_tokens // eligible)
        return threshold

    def _num_new_tokens(self, req: Any, num_computed: int, threshold: int, budget: int) -> int:
        num_new = req.num_tokens - num_computed
        if 0 < threshold < num_new:
            num_new = threshold
        return int(min(num_new, budget, self.settings.chunk_cap))

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
        limit = self.settings.chunk_cap
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
        if self.on_preempt is not None:
            self.on_preempt(victim)

    def _pick_victim(self) -> Seq:
        """FCFS: the newest running request; priority: the largest (priority, arrival),
        the first of equals (as vLLM's ``max``)."""
        running = self.running
        if self.settings.policy != "priority":
            return running.pop()
        victim = max(running, key=lambda s: (s.source.priority, s.source.arrival_s))
        running.remove(victim)
        return victim

    def _log_insert(self, seq: Seq, end_tokens: int) -> None:
        assert self.log is not None
        full = end_tokens // self.block_size
        if full > seq.logged_blocks:
            self.log.insert(seq.index, seq.logged_blocks, full)
            seq.logged_blocks = full

    def _schedule_running(self, scheduled: Scheduled, threshold: int) -> tuple[int, bool]:
        perf = time.perf_counter
        allocate = self.mgr.allocate_slots
        budget = self.settings.max_num_batched_tokens
        running, log = self.running, self.log
        align = self.align_block_size
        room = self.max_model_len - 1  # vLLM leaves one position for the sampled token
        preempted = False
        mgr_s = 0.0
        calls = 0
        i = 0
        while i < len(running) and budget > 0:
            seq = running[i]
            req = seq.req
            num_new = self._num_new_tokens(req, req.num_computed_tokens, threshold, budget)
            num_new = min(num_new, room - req.num_computed_tokens)
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
                position = {id(s): k for k, s in enumerate(running)}
                victim = self._pick_victim()
                if position[id(victim)] < i:
                    i -= 1
                    budget += self._unschedule(scheduled, victim)
                self._preempt(victim)
                if victim is seq:
                    break
            if blocks is None:
                if victim is seq and self.settings.policy == "priority":
                    continue  # later (higher-priority) requests may fit now
                break
            if log is not None:
                self._log_insert(seq, min(req.num_computed_tokens + num_new, req.num_tokens))
            scheduled.append((seq, num_new))
            budget -= num_new
            i += 1
        self.mgr_s += mgr_s
        self.calls["allocate_slots"] += calls
        return budget, preempted

    @staticmethod
    def _unschedule(scheduled: Scheduled, victim: Seq) -> int:
        """Drop a preempted request's entry of this step; the tokens it had."""
        for k, (seq, n) in enumerate(scheduled):
            if seq is victim:
                del scheduled[k]
                return n
        return 0

    def _build_request(self, seq: Seq) -> None:
        t0 = time.perf_counter()
        seq.req = self.make_request(str(seq.index), prompt_tokens(seq.source))
        seq.out = output_tokens(seq.source)[: seq.target]
        self.req_s += time.perf_counter() - t0

    def _admit(self, scheduled: Scheduled, budget: int, threshold: int) -> None:
        perf = time.perf_counter
        mgr = self.mgr
        max_seqs = self.settings.max_num_seqs
        running, waiting = self.running, self.waiting
        while waiting and len(running) < max_seqs and budget > 0:
            seq = waiting.peek()
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
            num_new = self._num_new_tokens(req, num_hit, threshold, budget)
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
