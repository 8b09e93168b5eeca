"""The generation engine online: requests arrive at any time, tokens leave as they come.

One thread owns the KV cache manager and the model. Each step it takes new requests
and cancellations from a thread-safe inbox, runs one scheduler step of
:class:`~pagedkv.hf.engine.PagedGenerator` (chunked prefill, prefix hits, recompute
preemption), hands each sampled token to its request's sink, and publishes the step's
KV events (vLLM's wire format) when a publisher is given. The manager lives as long as
the engine, so later requests hit the blocks earlier ones cached.
"""

from __future__ import annotations

import itertools
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, NamedTuple

from pagedkv.errors import ConfigError
from pagedkv.hf.attention import ATTENTION_NAME
from pagedkv.hf.engine import PagedGenerator, eos_token_ids
from pagedkv.hf.figures import FigureCounter
from pagedkv.hf.scheduler import GenerationScheduler
from pagedkv.runtime import KVCacheManager, Request
from pagedkv.tensors.workload import ScheduledChunk

__all__ = ["EngineCounters", "OnlineEngine", "TokenSink"]

# sink(token_id, finish_reason): a token (finish_reason None), then a last call with
# token_id None and the reason: "length", "stop", "abort" or "error: ..."
TokenSink = Callable[[int | None, str | None], None]
_IDLE_WAIT_S = 0.05


class EngineCounters(NamedTuple):
    """What ``/metrics`` exports (vLLM's meanings)."""

    num_running: int
    num_waiting: int
    kv_cache_usage: float  # used / usable blocks, 0..1
    prompt_tokens: int
    generation_tokens: int
    prefix_cache_queries: int
    prefix_cache_hits: int
    preemptions: int
    finished: Mapping[str, int]  # by finish reason


@dataclass
class _Pending:
    request_id: str
    prompt: tuple[int, ...]
    max_tokens: int
    sink: TokenSink


class _OnlineScheduler(GenerationScheduler):
    """GenerationScheduler fed from the engine's inbox instead of a fixed workload."""

    arrivals: deque[_Pending] | None = None

    def _arrive(self) -> None:
        assert self.arrivals is not None
        while self.arrivals:
            item = self.arrivals.popleft()
            self.waiting.append(Request(item.request_id, item.prompt))
            self.outputs[item.request_id] = (0,) * item.max_tokens


class OnlineEngine:
    """Serve ``generator``'s model to concurrent requests (see the module doc).

    ``publish``: called with each step's KV events (a ``ZmqEventPublisher.publish``);
    ``max_waiting``: requests queued beyond it are refused (``submit`` raises).
    """

    def __init__(
        self,
        generator: PagedGenerator,
        *,
        publish: Callable[[Sequence[Any]], object] | None = None,
        max_waiting: int = 1024,
    ) -> None:
        self.generator = generator
        self.publish = publish
        self.max_waiting = max_waiting
        self.manager = KVCacheManager(
            generator.kv_cache_config,
            generator.config,
            enable_events=publish is not None,
        )
        self.max_model_len = self.manager.max_model_len
        self.usable_blocks = max(generator.kv_cache_config.num_blocks - 1, 1)
        self._scheduler = _OnlineScheduler(
            self.manager,
            [],
            generator.max_num_batched_tokens,
            generator.max_num_seqs,
            eos_token_ids=eos_token_ids(generator.model),
        )
        self._scheduler.arrivals = deque()
        self._counter = FigureCounter(self.manager, generator.kv_cache_config, [])
        self._sinks: dict[str, TokenSink] = {}
        self._inbox: deque[_Pending] = deque()
        self._aborts: deque[str] = deque()
        self._resets: deque[Future[bool]] = deque()
        self._wake = threading.Condition()
        self._stop = False
        self._ids = itertools.count()
        self._prompt_tokens = self._generation_tokens = 0
        self._finished: dict[str, int] = {}
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="pagedkv-engine", daemon=True)

    # -- client side ----------------------------------------------------------------
    def start(self) -> OnlineEngine:
        self.generator.model.set_attn_implementation(ATTENTION_NAME)
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        with self._wake:
            self._stop = True
            self._wake.notify()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def submit(self, prompt: Sequence[int], max_tokens: int, sink: TokenSink) -> str:
        """Queue a request; its id. ConfigError (the caller's 400) if it cannot fit,
        OverflowError (a 503) when too many wait."""
        if not prompt:
            raise ConfigError("the prompt is empty")
        if max_tokens < 1:
            raise ConfigError(f"max_tokens must be at least 1, got {max_tokens}")
        if len(prompt) + max_tokens > self.max_model_len:
            raise ConfigError(
                f"{len(prompt)} prompt tokens + max_tokens={max_tokens} exceed the "
                f"model's {self.max_model_len} tokens"
            )
        vocab = int(self.generator.model.config.vocab_size)
        if any(not 0 <= t < vocab for t in prompt):
            raise ConfigError(f"a prompt token id is outside the vocabulary (0..{vocab - 1})")
        if not self.alive:
            raise OverflowError(f"the engine is not running ({self.error!r})")
        request_id = f"req-{next(self._ids)}"
        with self._wake:
            if len(self._inbox) + len(self._scheduler.waiting) >= self.max_waiting:
                raise OverflowError(f"{self.max_waiting} requests are already waiting")
            self._inbox.append(_Pending(request_id, tuple(prompt), max_tokens, sink))
            self._wake.notify()
        return request_id

    def abort(self, request_id: str) -> None:
        """Stop a request (its client went away); its sink hears ``abort``."""
        with self._wake:
            self._aborts.append(request_id)
            self._wake.notify()

    def reset_prefix_cache(self, timeout_s: float = 30.0) -> bool:
        """Forget every cached block (vLLM's ``/reset_prefix_cache``), done between steps;
        False while a running request holds blocks."""
        done: Future[bool] = Future()
        with self._wake:
            self._resets.append(done)
            self._wake.notify()
        return done.result(timeout_s)

    def counters(self) -> EngineCounters:
        sched = self._scheduler
        stats = self.manager.prefix_cache_stats
        used = self.usable_blocks - self.manager.num_free_blocks
        return EngineCounters(
            num_running=len(sched.running),
            num_waiting=len(sched.waiting) + len(self._inbox),
            kv_cache_usage=max(0.0, min(1.0, used / self.usable_blocks)),
            prompt_tokens=self._prompt_tokens,
            generation_tokens=self._generation_tokens,
            prefix_cache_queries=stats.queries,
            prefix_cache_hits=stats.hits,
            preemptions=sched.num_preemptions,
            finished=dict(self._finished),
        )

    # -- engine thread --------------------------------------------------------------
    def _run(self) -> None:
        try:
            while self._next_step():
                self._step()
        except BaseException as exc:
            self.error = exc
            self._fail_all(f"error: {exc}")

    def _next_step(self) -> bool:
        """Move the inbox into the scheduler; wait while there is nothing to do."""
        with self._wake:
            while not self._stop:
                while self._inbox:
                    item = self._inbox.popleft()
                    self._sinks[item.request_id] = item.sink
                    self._prompt_tokens += len(item.prompt)
                    assert self._scheduler.arrivals is not None
                    self._scheduler.arrivals.append(item)
                aborts = list(self._aborts)
                self._aborts.clear()
                resets = list(self._resets)
                self._resets.clear()
                if self._sinks or aborts or resets:
                    break
                self._wake.wait(_IDLE_WAIT_S)
            else:
                return False
        for request_id in aborts:
            self._cancel(request_id)
        for done in resets:
            done.set_result(self.manager.reset_prefix_cache())
        return True

    def _step(self) -> None:
        sched = self._scheduler
        if sched.waiting or sched.running or sched.arrivals:
            chunks = sched.step()
            sampled = self.generator.run_step(chunks, self.manager, self._counter)
            self._finish(chunks, sampled)
        if self.publish is not None:
            events = self.manager.take_events()
            if events:
                self.publish(events)

    def _finish(self, chunks: list[ScheduledChunk], sampled: Mapping[str, int]) -> None:
        sched = self._scheduler
        done_before = set(sched.generated)
        sched.finish_with_tokens(chunks, sampled)
        for request_id, token in sampled.items():
            self._generation_tokens += 1
            sink = self._sinks.get(request_id)
            if sink is not None:
                sink(token, None)
        for request_id in set(sched.generated) - done_before:
            tokens = sched.generated.pop(request_id)
            limit = len(sched.outputs.pop(request_id))
            reason = "length" if len(tokens) >= limit else "stop"
            self._end(request_id, reason)

    def _cancel(self, request_id: str) -> None:
        sched = self._scheduler
        assert sched.arrivals is not None
        for item in list(sched.arrivals):
            if item.request_id == request_id:
                sched.arrivals.remove(item)
        for queue in (sched.waiting, sched.running):
            for request in list(queue):
                if request.request_id == request_id:
                    queue.remove(request)
                    self.manager.free(request)
        sched.outputs.pop(request_id, None)
        if request_id in self._sinks:
            self._end(request_id, "abort")

    def _end(self, request_id: str, reason: str) -> None:
        self._finished[reason] = self._finished.get(reason, 0) + 1
        sink = self._sinks.pop(request_id, None)
        if sink is not None:
            sink(None, reason)

    def _fail_all(self, reason: str) -> None:
        with self._wake:
            sinks = list(self._sinks.values()) + [p.sink for p in self._inbox]
            self._sinks.clear()
            self._inbox.clear()
        for sink in sinks:
            sink(None, reason)
