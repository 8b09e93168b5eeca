"""``Simulator``: one replica (a manager and its engine knobs) that replays traces."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from pagedkv.sim.reports.bound import AccessLog
from pagedkv.sim.reports.metrics import SimResult
from pagedkv.sim.scheduling.loop import EngineLoop
from pagedkv.sim.scheduling.scheduler import Scheduler, SchedulerSettings
from pagedkv.sim.traces.trace import Trace

__all__ = [
    "Simulator",
]


class Simulator:
    """Replays a trace through one ``KVCacheManager`` (fresh per run; see ``sim/setup.py``).

    ``make_request(request_id, token_ids)`` builds the runtime ``Request``;
    ``block_size`` is the block size of the access log and bound. Evictions are the
    manager's ``num_evictions`` at the end of the run (``None`` for a manager without it).

    Args:
        manager: the KV cache manager replayed on.
        make_request: builds the runtime request from an id and token ids.
        max_model_len: the longest sequence in tokens.
        block_size: tokens per block of the access log and bound.
        num_blocks: blocks in the cache, for usage figures.
        settings: the scheduler settings (None: the defaults).
        model_name: the model's name, for the result.
        kv_cache_groups: a label per KV cache group, for the result.
        align_block_size: Mamba "align" mode's block size in tokens (0: off).
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

    def loop(
        self,
        trace: Trace | None = None,
        *,
        access_log: AccessLog | None = None,
        steps_path: str | None = None,
        keep_steps: bool = False,
        progress: Callable[[int], None] | None = None,
    ) -> EngineLoop:
        """An engine loop over this simulator's manager, with ``trace``'s requests
        submitted (or none: ``submit`` them and ``step`` the loop yourself).

        Args:
            trace: the requests submitted (None: none).
            access_log: records lookups and insertions for the bound (None: none).
            steps_path: a file the per-step records are written to (None: none).
            keep_steps: keep the per-step series in the result.
            progress: called with the requests done, every 256 steps.
        """
        scheduler = Scheduler(
            self.mgr,
            self.make_request,
            self.settings,
            max_model_len=self.max_model_len,
            block_size=self.block_size,
            align_block_size=self.align_block_size,
            log=access_log,
        )
        loop = EngineLoop(
            scheduler,
            num_blocks=self.num_blocks,
            model_name=self.model_name,
            trace_name=trace.name if trace is not None else "trace",
            kv_cache_groups=self.kv_cache_groups,
            steps_path=steps_path,
            keep_steps=keep_steps,
            progress=progress,
        )
        for index, request in enumerate(trace.requests if trace is not None else ()):
            loop.submit(index, request)
        return loop

    def run(
        self,
        trace: Trace,
        *,
        access_log: AccessLog | None = None,
        steps_path: str | None = None,
        keep_steps: bool = False,
        progress: Callable[[int], None] | None = None,
    ) -> SimResult:
        """Replay ``trace``; ``progress(requests_done)`` is called every 256 steps; with
        ``keep_steps`` the result holds the per-step series (``to_dataframe()``).

        Args:
            trace: the requests replayed.
            access_log: records lookups and insertions for the bound (None: none).
            steps_path: a file the per-step records are written to (None: none).
            keep_steps: keep the per-step series in the result.
            progress: called with the requests done, every 256 steps.
        """
        loop = self.loop(
            trace,
            access_log=access_log,
            steps_path=steps_path,
            keep_steps=keep_steps,
            progress=progress,
        )
        result = loop.run()
        return dataclasses.replace(result, trace_requests=trace.total_requests)
