"""Keep a KVIndex up to date from live engines: one subscriber per engine, one thread.

The thread owns every socket. It applies each engine's batches in order (a subscriber's
``reset`` clears that engine first), holding ``lock`` while it does, so readers that take
the same lock see whole batches only. Replay requests never hold the thread: each is a
socket in the same poll, so while one engine's replay waits for an answer (or for its
timeout) the other engines' batches are applied as they come; that engine's own live
batches wait, in order, behind its replay. An engine quiet for ``idle_sync_s`` is asked
for its tail by replay (less and less often while its replay endpoint does not answer),
so a batch lost at the end of a burst is not left missing until the engine's next step.
``sync()`` does that for every engine now and waits for it. At most ``max_replays``
replay requests are open at once (each holds a socket); the others wait their turn, so
the file descriptors the feed needs grow by two per engine (its SUB socket), not four.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import NamedTuple

import zmq

from pagedkv.cluster.index import KVIndex
from pagedkv.errors import ConfigError
from pagedkv.events.replay_slots import ReplaySlots
from pagedkv.events.subscriber import Delivery, EventSubscriber

__all__ = [
    "MAX_IDLE_SYNC_S",
    "MAX_REPLAYS",
    "DESCRIPTORS_PER_SOCKET",
    "SPARE_DESCRIPTORS",
    "descriptors_needed",
    "reserve_descriptors",
    "EngineEndpoints",
    "EngineFeedStats",
    "IndexFeed",
]

MAX_IDLE_SYNC_S = 60.0
MAX_REPLAYS = 32  # replay requests open at once, over all engines
# A ZeroMQ socket holds a descriptor for its mailbox and one per TCP connection: an
# engine's SUB socket two, a replay request's DEALER two more while it is open.
DESCRIPTORS_PER_SOCKET = 2
SPARE_DESCRIPTORS = 64  # ZeroMQ's threads, the interpreter's own files, the HTTP server


def descriptors_needed(num_engines: int, max_replays: int = MAX_REPLAYS) -> int:
    """File descriptors a feed for ``num_engines`` engines may hold at once."""
    sockets = num_engines + min(max_replays, num_engines)
    return DESCRIPTORS_PER_SOCKET * sockets + SPARE_DESCRIPTORS


def reserve_descriptors(num_engines: int, max_replays: int = MAX_REPLAYS) -> None:
    """Raise this process's open-file limit (up to its hard limit) to what
    ``num_engines`` need; ConfigError naming the numbers if it cannot."""
    try:
        import resource
    except ImportError:  # not POSIX: nothing to check
        return
    need = descriptors_needed(num_engines, max_replays)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= need:
        return
    target = need if hard == resource.RLIM_INFINITY else min(need, hard)
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft != resource.RLIM_INFINITY and soft < need:
        raise ConfigError(
            f"index feed: {num_engines} engines need about {need} open files (two per "
            f"engine, two per replay in flight, {SPARE_DESCRIPTORS} spare), and this process "
            f"may open {soft} (RLIMIT_NOFILE, hard limit {hard}); raise the limit "
            f"(ulimit -n {need} in the shell that starts it, or LimitNOFILE={need} in its "
            "systemd unit) or subscribe fewer engines"
        )


class EngineEndpoints(NamedTuple):
    """An engine's PUB address and (optional) replay address."""

    endpoint: str
    replay_endpoint: str | None = None


class EngineFeedStats(NamedTuple):
    """One engine's stream as the feed read it."""

    batches: int
    gaps: int
    recovered: int  # gap batches replayed
    replayed: int  # batches that came by replay (gaps, and tails after a quiet spell)
    lost: int
    restarts: int
    decode_errors: int
    replay_timeouts: int
    next_seq: int | None
    last_batch_ts: float | None  # the last applied batch's timestamp (the engine's clock)
    replay_pending: bool  # a replay request is open (waits for a slot or its answer)
    replay_unanswered: int  # replay requests unanswered in a row (0: it answers)
    seconds_since_batch: float | None  # since the feed applied its last batch (own clock)


class IndexFeed:
    """Subscribes to ``engines`` and applies their events to ``index`` in a thread.

    ``drop_every`` (tests only) discards every Nth live message, to exercise replay.

    Args:
        index: the KV index the engines' events are applied to.
        engines: engine name -> its event and replay endpoints.
        topic: the ZMQ topic subscribed to ("" for every topic).
        idle_sync_s: seconds without a message from an engine before its tail is synced by replay.
        replay_timeout_s: seconds a replay request waits for its answer.
        drop_every: discard every Nth live message (0: none); tests only.
        max_replays: replay requests open at once, over all engines.
    """

    def __init__(
        self,
        index: KVIndex,
        engines: Mapping[str, EngineEndpoints],
        *,
        topic: str = "",
        idle_sync_s: float = 1.0,
        replay_timeout_s: float = 1.0,
        max_replays: int = MAX_REPLAYS,
        drop_every: int = 0,
    ) -> None:
        self.index = index
        self.engines = dict(engines)
        self.topic = topic
        self.idle_sync_s = idle_sync_s
        self.replay_timeout_s = replay_timeout_s
        self.drop_every = drop_every
        self.replay_slots = ReplaySlots(max_replays)
        self.lock = threading.Lock()
        self._stop = threading.Event()
        self._sync_requested = threading.Event()
        self._synced = threading.Event()
        self._ready = threading.Event()
        self._subs: dict[str, EventSubscriber] = {}
        self._last_ts: dict[str, float] = {}
        self._applied_at: dict[str, float] = {}  # engine -> time.monotonic() of its last batch
        self._received = 0
        self._commands: deque[tuple[str, str]] = deque()  # (forget | resync, engine)
        # the feed thread's: the poll over every SUB socket and the replays in flight
        self._poller = zmq.Poller()
        self._by_socket: dict[zmq.Socket[bytes], str] = {}
        # engine -> its open replay's socket (None while it waits for a slot), oldest first
        self._replaying: dict[str, zmq.Socket[bytes] | None] = {}
        self._last_seen: dict[str, float] = {}  # engine -> its last message or replay
        self.error: BaseException | None = None  # what stopped the feed thread, if anything
        self._thread = threading.Thread(target=self._run, name="pagedkv-index-feed", daemon=True)
        for name in self.engines:
            index.add_engine(name)

    def start(self, timeout_s: float = 5.0) -> IndexFeed:
        reserve_descriptors(len(self.engines), self.replay_slots.limit)
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

    @property
    def replays_open(self) -> int:
        """Replay requests holding a socket now (at most ``max_replays``)."""
        return self.replay_slots.in_use

    def stats(self) -> dict[str, EngineFeedStats]:
        """Per engine: batches applied, gaps, recovered and lost batches, restarts."""
        with self.lock:
            now = time.monotonic()
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
                    sub.replay_in_flight,
                    sub.replay_unanswered,
                    None if name not in self._applied_at else now - self._applied_at[name],
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
        ctx.set(zmq.MAX_SOCKETS, descriptors_needed(len(self.engines), self.replay_slots.limit))
        try:
            for name, ends in self.engines.items():
                try:
                    sub = EventSubscriber(
                        ends.endpoint, ends.replay_endpoint, self.topic, context=ctx,
                        replay_timeout_s=self.replay_timeout_s, replay_slots=self.replay_slots,
                    )  # fmt: skip
                except zmq.ZMQError as exc:
                    raise ConfigError(f"engine {name!r} at {ends.endpoint}: {exc}") from exc
                self._subs[name] = sub
                self._by_socket[sub.socket] = name
                self._poller.register(sub.socket, zmq.POLLIN)
            self._ready.set()
            self._loop()
        except Exception as exc:
            self.error = exc
        finally:
            self._ready.set()
            for sub in self._subs.values():
                sub.close()
            ctx.destroy(linger=0)

    def _loop(self) -> None:
        last_seen = self._last_seen
        last_seen.update(dict.fromkeys(self.engines, time.monotonic()))
        syncing: set[str] = set()  # engines whose replay a sync() waits for
        while not self._stop.is_set():
            for sock, _ in self._poller.poll(self._poll_ms()):
                name = self._by_socket.get(sock)
                if name is None:  # a replay that ended earlier in this round
                    continue
                sub = self._subs[name]
                if sock is sub.socket:
                    last_seen[name] = time.monotonic()
                    self._receive(name, sub)
                elif sock is sub.replay_socket:
                    self._step(name, sub.advance)
            now = time.monotonic()
            for name in list(self._replaying):
                deadline = self._subs[name].replay_deadline_s
                if deadline is not None and now >= deadline:
                    self._step(name, self._subs[name].advance)
            while self._commands:
                self._command(*self._commands.popleft())
            if self._sync_requested.is_set():
                self._sync_requested.clear()
                for name, sub in self._subs.items():
                    self._step(name, sub.begin_tail)
                syncing = set(self._subs)
            self._admit_waiting()
            if syncing:
                syncing &= set(self._replaying)
                if not syncing:
                    self._synced.set()
            now = time.monotonic()
            for name, seen in last_seen.items():
                if name not in self._replaying and now - seen >= self._idle_wait_s(name):
                    last_seen[name] = now
                    self._step(name, self._subs[name].begin_tail)

    def _poll_ms(self) -> int:
        """50 ms, or less when a replay's deadline comes sooner."""
        deadlines = [self._subs[n].replay_deadline_s for n in self._replaying]
        soonest = min((d for d in deadlines if d is not None), default=None)
        if soonest is None:
            return 50
        return max(0, min(50, int((soonest - time.monotonic()) * 1000) + 1))

    def _idle_wait_s(self, name: str) -> float:
        """How long an engine stays quiet before its tail is asked: ``idle_sync_s``,
        doubling (up to ``MAX_IDLE_SYNC_S``) for each ask its replay endpoint left
        unanswered in a row."""
        unanswered = min(self._subs[name].replay_unanswered, 32)
        return float(min(self.idle_sync_s * 2**unanswered, max(MAX_IDLE_SYNC_S, self.idle_sync_s)))

    def _step(self, name: str, action: Callable[[], list[Delivery]]) -> None:
        """Run one subscriber action, apply what it delivers, and poll its replay
        socket while a replay is in flight."""
        self._apply(name, action())
        self._track_replay(name)

    def _admit_waiting(self) -> None:
        """Send the replay requests waiting for a slot, oldest first, while slots are free."""
        for name, sock in list(self._replaying.items()):
            if self.replay_slots.free == 0:
                return
            if sock is None and self._subs[name].replay_waiting:
                self._step(name, self._subs[name].advance)

    def _track_replay(self, name: str) -> None:
        sub = self._subs[name]
        sock = sub.replay_socket
        in_flight = sub.replay_in_flight
        if in_flight and name in self._replaying and self._replaying[name] is sock:
            return
        was_in_flight = name in self._replaying
        old = self._replaying.pop(name, None)
        if old is not None:
            self._poller.unregister(old)
            del self._by_socket[old]
        if in_flight:
            if sock is not None:
                self._poller.register(sock, zmq.POLLIN)
                self._by_socket[sock] = name
            self._replaying[name] = sock
        elif was_in_flight:
            self._last_seen[name] = time.monotonic()  # quiet from the replay's end on

    def _command(self, command: str, name: str) -> None:
        sub = self._subs.get(name)
        if sub is None:
            return
        sub.restart_from(0)
        self._track_replay(name)
        if command == "forget":
            self._reset(name)
        else:
            self._step(name, sub.begin_tail)

    def _receive(self, name: str, sub: EventSubscriber) -> None:
        for _ in range(1000):
            try:
                frames = sub.socket.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            self._received += 1
            if self.drop_every and self._received % self.drop_every == 0:
                continue
            self._apply(name, sub.receive(frames))
        self._track_replay(name)

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
                self._applied_at[name] = time.monotonic()
