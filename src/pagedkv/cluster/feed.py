"""Keep a KVIndex up to date from live engines: one subscriber per engine, one thread.

The thread owns every socket. It applies each engine's batches in order (a subscriber's
``reset`` clears that engine first), holding ``lock`` while it does, so readers that take
the same lock see whole batches only. An engine quiet for ``idle_sync_s`` is asked for
its tail by replay (less and less often while its replay endpoint does not answer), so
a batch lost at the end of a burst is not left missing until the engine's next step.
``sync()`` does that for every engine now and waits for it.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from collections.abc import Mapping
from typing import NamedTuple

import zmq

from pagedkv.cluster.index import KVIndex
from pagedkv.errors import ConfigError
from pagedkv.events.subscriber import Delivery, EventSubscriber

MAX_IDLE_SYNC_S = 60.0
# Per engine: its SUB socket and, while replay is asked, a DEALER; each holds a TCP
# connection (a file descriptor). The rest: ZeroMQ's own threads and signalers.
SOCKETS_PER_ENGINE = 2
SPARE_DESCRIPTORS = 64


def reserve_descriptors(num_engines: int) -> None:
    """Raise this process's open-file limit (up to its hard limit) to what
    ``num_engines`` need; ConfigError naming the numbers if it cannot."""
    try:
        import resource
    except ImportError:  # not POSIX: nothing to check
        return
    need = SOCKETS_PER_ENGINE * num_engines + SPARE_DESCRIPTORS
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= need:
        return
    target = need if hard == resource.RLIM_INFINITY else min(need, hard)
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft != resource.RLIM_INFINITY and soft < need:
        raise ConfigError(
            f"index feed: {num_engines} engines need about {need} open files, and this "
            f"process may open {soft} (hard limit {hard}); raise it (ulimit -n {need})"
        )


class EngineEndpoints(NamedTuple):
    """An engine's PUB address and (optional) replay address."""

    endpoint: str
    replay_endpoint: str | None = None


class EngineFeedStats(NamedTuple):
    batches: int
    gaps: int
    recovered: int  # gap batches replayed
    replayed: int  # batches that came by replay (gaps, and tails after a quiet spell)
    lost: int
    restarts: int
    decode_errors: int
    replay_timeouts: int
    next_seq: int | None
    last_batch_ts: float | None


class IndexFeed:
    """Subscribes to ``engines`` and applies their events to ``index`` in a thread.

    ``drop_every`` (tests only) discards every Nth live message, to exercise replay.
    """

    def __init__(
        self,
        index: KVIndex,
        engines: Mapping[str, EngineEndpoints],
        *,
        topic: str = "",
        idle_sync_s: float = 1.0,
        replay_timeout_s: float = 1.0,
        drop_every: int = 0,
    ) -> None:
        self.index = index
        self.engines = dict(engines)
        self.topic = topic
        self.idle_sync_s = idle_sync_s
        self.replay_timeout_s = replay_timeout_s
        self.drop_every = drop_every
        self.lock = threading.Lock()
        self._stop = threading.Event()
        self._sync_requested = threading.Event()
        self._synced = threading.Event()
        self._ready = threading.Event()
        self._subs: dict[str, EventSubscriber] = {}
        self._last_ts: dict[str, float] = {}
        self._received = 0
        self._commands: deque[tuple[str, str]] = deque()  # (forget | resync, engine)
        self.error: BaseException | None = None  # what stopped the feed thread, if anything
        self._thread = threading.Thread(target=self._run, name="pagedkv-index-feed", daemon=True)
        for name in self.engines:
            index.add_engine(name)

    def start(self, timeout_s: float = 5.0) -> IndexFeed:
        reserve_descriptors(len(self.engines))
        self._thread.start()
        if not self._ready.wait(timeout_s):
            raise TimeoutError("the index feed did not start")
        if self.error is not None:
            raise ConfigError(f"index feed: cannot subscribe: {self.error}") from self.error
        return self

    @property
    def alive(self) -> bool:
        """Whether the feed thread runs (False after ``stop()`` or an error: see ``error``)."""
        return self._thread.is_alive()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    def sync(self, timeout_s: float = 10.0) -> bool:
        """Ask every engine for what it published since its last applied batch; True
        once done within ``timeout_s``."""
        self._synced.clear()
        self._sync_requested.set()
        return self._synced.wait(timeout_s)

    def forget(self, engine: str) -> None:
        """Drop ``engine``'s blocks from the index (it went down); done by the feed thread,
        so the caller never waits for the index."""
        self._commands.append(("forget", engine))

    def resync(self, engine: str) -> None:
        """Rebuild ``engine``'s part of the index from its publisher's replay buffer (it
        came back, perhaps as a new process): state dropped, read again from seq 0."""
        self._commands.append(("resync", engine))

    def stats(self) -> dict[str, EngineFeedStats]:
        """Per engine: batches applied, gaps, recovered and lost batches, restarts."""
        with self.lock:
            return {
                name: EngineFeedStats(
                    sub.num_batches,
                    sub.num_gaps,
                    sub.num_recovered,
                    sub.num_replayed,
                    sub.num_lost,
                    sub.num_restarts,
                    sub.num_decode_errors,
                    sub.num_replay_timeouts,
                    sub.next_seq,
                    self._last_ts.get(name),
                )
                for name, sub in self._subs.items()
            }

    def __enter__(self) -> IndexFeed:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- feed thread --------------------------------------------------------------------
    def _run(self) -> None:
        ctx = zmq.Context()
        # ZeroMQ's default cap is 1023 sockets a context: past it no engine could start
        ctx.set(zmq.MAX_SOCKETS, SOCKETS_PER_ENGINE * len(self.engines) + SPARE_DESCRIPTORS)
        poller = zmq.Poller()
        by_socket: dict[zmq.Socket, str] = {}
        try:
            for name, ends in self.engines.items():
                try:
                    sub = EventSubscriber(
                        ends.endpoint, ends.replay_endpoint, self.topic, context=ctx,
                        replay_timeout_s=self.replay_timeout_s,
                    )  # fmt: skip
                except zmq.ZMQError as exc:
                    raise ConfigError(f"engine {name!r} at {ends.endpoint}: {exc}") from exc
                self._subs[name] = sub
                by_socket[sub.socket] = name
                poller.register(sub.socket, zmq.POLLIN)
            self._ready.set()
            last_seen = dict.fromkeys(self.engines, time.monotonic())
            idle_s = dict.fromkeys(self.engines, self.idle_sync_s)
            while not self._stop.is_set():
                for sock, _ in poller.poll(50):
                    name = by_socket[sock]
                    last_seen[name] = time.monotonic()
                    self._receive(name, self._subs[name])
                while self._commands:
                    self._command(*self._commands.popleft())
                if self._sync_requested.is_set():
                    self._sync_requested.clear()
                    for name, sub in self._subs.items():
                        self._apply(name, sub.sync_tail())
                    self._synced.set()
                    continue
                now = time.monotonic()
                for name, seen in last_seen.items():
                    if now - seen >= idle_s[name]:
                        idle_s[name] = self._idle_sync(name, self._subs[name], idle_s[name])
                        last_seen[name] = time.monotonic()
        except Exception as exc:
            self.error = exc
        finally:
            self._ready.set()
            for sub in self._subs.values():
                sub.close()
            ctx.destroy(linger=0)

    def _command(self, command: str, name: str) -> None:
        sub = self._subs.get(name)
        if sub is None:
            return
        if command == "forget":
            self._reset(name)
            sub.restart_from(0)
        else:
            sub.restart_from(0)
            self._apply(name, sub.sync_tail())

    def _idle_sync(self, name: str, sub: EventSubscriber, idle_s: float) -> float:
        """Ask a quiet engine for its tail; the wait before the next ask doubles (up to
        ``MAX_IDLE_SYNC_S``) while its replay endpoint does not answer, since each
        unanswered ask holds the thread for ``replay_timeout_s``."""
        timeouts = sub.num_replay_timeouts
        self._apply(name, sub.sync_tail())
        if sub.num_replay_timeouts == timeouts:
            return self.idle_sync_s
        return min(2 * idle_s, max(MAX_IDLE_SYNC_S, self.idle_sync_s))

    def _receive(self, name: str, sub: EventSubscriber) -> None:
        for _ in range(1000):
            try:
                frames = sub.socket.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            self._received += 1
            if self.drop_every and self._received % self.drop_every == 0:
                continue
            self._apply(name, sub.handle(frames))

    def _reset(self, name: str) -> None:
        """Clear ``name`` in the index a step at a time, releasing the lock in between."""
        steps = self.index.reset_engine_steps(name)
        while True:
            with self.lock:
                if next(steps, StopIteration) is StopIteration:
                    return

    def _apply(self, name: str, deliveries: list[Delivery]) -> None:
        for delivery in deliveries:
            if delivery.reset:
                self._reset(name)
            with self.lock:
                self.index.apply_batch(name, delivery.batch)
                self._last_ts[name] = delivery.batch.ts
