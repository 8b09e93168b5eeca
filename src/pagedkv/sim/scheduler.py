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
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from pagedkv.errors import ConfigError, PagedKVError
from pagedkv.sim.bound import AccessLog
from pagedkv.sim.metrics import SimResult
from pagedkv.sim.trace import Trace

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


def _supports(method: Callable[..., Any], name: str) -> bool:
    try:
        return name in inspect.signature(method).parameters
    except (TypeError, ValueError):
        return False


class Simulator:
    """Replays a trace through one ``KVCacheManager`` (fresh per run; see ``engine.py``).

    ``make_request(request_id, token_ids)`` builds the runtime ``Request``;
    ``block_size`` is the block size of the access log and bound. Evictions are the
    manager's ``num_evictions`` at the end of the run (``None`` for a manager without it).
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
        align_block_size: int = 0,
    ) -> None:
        self.mgr = manager
        self.make_request = make_request
        self.max_model_len = max_model_len
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.settings = settings or SchedulerSettings()
        self.model_name = model_name
        self.kv_cache_groups = kv_cache_groups
        # Mamba "align" mode: prefill chunks end on multiples of this many tokens (0: off).
        self.align_block_size = align_block_size
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
        from pagedkv.sim.loop import RunState

        return RunState(self, trace, access_log, steps_path, progress).run()
