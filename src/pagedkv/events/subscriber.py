"""Read one publisher's KV event stream (pagedkv's or vLLM's) in order, losses repaired.

Sequence numbers must be contiguous. A gap is asked from the publisher's replay endpoint
(a fresh DEALER per request: ``[b"", start]`` out, ``[b"", topic, seq, payload]`` back
until the end marker). What replay cannot give back is lost for good: the next batch is
delivered with ``reset=True`` so the consumer drops that engine's state and rebuilds it
from the events that follow. A sequence number that goes back with another payload means
the publisher restarted: also ``reset=True``, and the new stream is read from 0.

Replay never has to block the caller: ``receive``/``begin_tail`` start a request and
return, ``replay_socket`` turns readable as answers come, and ``advance`` finishes it
(at the end marker or once ``replay_timeout_s`` passed). Live messages that arrive
meanwhile are held and handled, in order, once it is done. ``handle`` and ``sync_tail``
do the same and wait, for callers with one publisher. Subscribers sharing a
``ReplaySlots`` open at most its ``limit`` replay sockets at once: a request past it
waits (``replay_waiting``) until ``advance`` finds a slot free. A replay socket that
cannot be opened (no file descriptor left) counts as a request left unanswered.
"""

from __future__ import annotations

import time
import zlib
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import NamedTuple

import zmq

from pagedkv.errors import KVCacheRuntimeError
from pagedkv.events.publisher import END_MARKER
from pagedkv.events.replay_slots import ReplaySlots
from pagedkv.events.wire import EventBatch, decode_payload

_RECENT = 4096  # checksums of recently applied batches (to tell duplicates from restarts)


__all__ = ["Delivery", "EventSubscriber", "PendingReplay"]


class Delivery(NamedTuple):
    """One batch in order; ``reset``: discard the engine's state before applying it."""

    seq: int
    batch: EventBatch
    reset: bool


@dataclass
class PendingReplay:
    """A replay request in flight: its DEALER asked for the batches from ``ask_from``.

    ``start``: the first batch wanted (``ask_from`` is one earlier when the batch applied
    there is checked, ``expected`` its checksum). ``live``: the live batch ``(seq,
    payload)`` whose gap this fills, None for a tail.
    """

    socket: zmq.Socket[bytes] | None
    ask_from: int
    start: int
    expected: int | None
    live: tuple[int, bytes] | None
    deadline_s: float  # time.monotonic() after which the answer is given up
    replies: list[tuple[int, bytes]] = field(default_factory=list)
    answered: bool = False  # the end marker came
    sent: bool = False  # asked (or given up at once); False: waits for a replay slot
    holds_slot: bool = False  # it took one of the shared ReplaySlots


class EventSubscriber:
    """A SUB socket (plus replay requests) for one publisher; sockets belong to the thread
    that calls ``poll``/``handle``/``sync_tail`` (or ``receive``/``begin_tail``/``advance``).
    ``start_seq=0`` replays a late join from the publisher's first batch; None starts at
    the first batch received.

    Args:
        endpoint: the publisher's PUB address.
        replay_endpoint: the publisher's replay ROUTER address (None: gaps cannot be recovered).
        topic: the topic subscribed to ("" for every topic).
        bind: bind (True) or connect (False) the SUB socket (None: bind when ``endpoint`` has a
            ``*``).
        start_seq: the first sequence number expected (0: replay from the first batch; None: the
            first received).
        replay_timeout_s: seconds a replay request waits for its answer.
        context: the ZMQ context sockets are made in (None: the process-wide instance).
        replay_slots: shared with the other subscribers of this thread, it caps their replay
            sockets open at once (None: no cap).
    """

    def __init__(
        self,
        endpoint: str,
        replay_endpoint: str | None = None,
        topic: str = "",
        *,
        bind: bool | None = None,
        start_seq: int | None = 0,
        replay_timeout_s: float = 1.0,
        context: zmq.Context[zmq.Socket[bytes]] | None = None,
        replay_slots: ReplaySlots | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.replay_endpoint = replay_endpoint
        self.replay_slots = replay_slots
        self.topic = topic.encode("utf-8")
        self.replay_timeout_s = replay_timeout_s
        self._ctx = context or zmq.Context.instance()
        self.socket = self._ctx.socket(zmq.SUB)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.setsockopt(zmq.RCVHWM, 0)
        self.socket.setsockopt(zmq.SUBSCRIBE, self.topic)
        if ("*" in endpoint) if bind is None else bind:
            self.socket.bind(endpoint)
        else:
            self.socket.connect(endpoint)
        self._next = start_seq
        self._stale = False
        self._recent: OrderedDict[int, int] = OrderedDict()
        self._replay: PendingReplay | None = None
        self._held: deque[list[bytes]] = deque()  # live messages waiting for the replay
        self._tail_wanted = False
        self.num_batches = self.num_gaps = self.num_recovered = self.num_lost = 0
        self.num_restarts = self.num_duplicates = self.num_decode_errors = 0
        self.num_replay_timeouts = 0
        self.num_replayed = 0  # batches delivered from replay (gaps and tails)
        self.replay_unanswered = 0  # replay requests unanswered in a row

    @property
    def next_seq(self) -> int | None:
        """The sequence number expected next (None before the first batch)."""
        return self._next

    @property
    def replay_socket(self) -> zmq.Socket[bytes] | None:
        """The socket of the replay in flight (readable when answers wait), or None."""
        return None if self._replay is None else self._replay.socket

    @property
    def replay_deadline_s(self) -> float | None:
        """When the replay in flight is given up (``time.monotonic()``), or None (none
        in flight, or it waits for a slot)."""
        if self._replay is None or self.replay_waiting:
            return None
        return self._replay.deadline_s

    @property
    def replay_in_flight(self) -> bool:
        """A replay request is open: waiting for a slot, for its answer, or to be finished."""
        return self._replay is not None

    @property
    def replay_waiting(self) -> bool:
        """A replay request waits for one of the shared ``replay_slots`` to be sent."""
        return self._replay is not None and not self._replay.sent

    def poll(self, timeout_s: float = 0.0, max_messages: int = 1000) -> list[Delivery]:
        """Batches that arrived (waiting up to ``timeout_s`` for the first), in order."""
        out: list[Delivery] = []
        if not self.socket.poll(int(timeout_s * 1000)):
            return out
        for _ in range(max_messages):
            try:
                frames = self.socket.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            out += self.handle(frames)
        return out

    def handle(self, frames: list[bytes]) -> list[Delivery]:
        """One live message (three frames) -> the batches it makes deliverable, waiting
        for the replay a gap needs."""
        return self.receive(frames) + self._wait()

    def sync_tail(self) -> list[Delivery]:
        """Ask the replay endpoint for everything after the last batch seen (a lost tail),
        and wait for the answer."""
        out = self.begin_tail()
        return out + self._wait()

    def receive(self, frames: list[bytes]) -> list[Delivery]:
        """One live message -> the batches deliverable now. A gap starts a replay and the
        message is held (so are later ones) until ``advance`` finishes it."""
        if self._replay is not None:
            self._held.append(frames)
            return []
        if len(frames) != 3 or len(frames[1]) != 8:
            self.num_decode_errors += 1
            self._stale = True
            return []
        topic, seq_bytes, payload = frames
        if topic != self.topic:
            return []  # a longer topic sharing our prefix
        seq = int.from_bytes(seq_bytes, "big")
        out: list[Delivery] = []
        if self._next is None:
            self._next = seq
        if seq < self._next:
            if self._recent.get(seq) == zlib.crc32(payload):
                self.num_duplicates += 1
                return out
            self.num_restarts += 1
            self._stale = True
            self._recent.clear()
            self._next = 0
        if seq > self._next:
            self.num_gaps += 1
            return self._start_replay(self._next, (seq, payload), checked=True)
        self._deliver(seq, payload, out)
        return out

    def begin_tail(self) -> list[Delivery]:
        """Start asking for everything after the last batch seen (after the replay in
        flight, if one is); what is deliverable at once is returned."""
        if self._replay is not None:
            self._tail_wanted = True
            return []
        return self._start_replay(self._next or 0, None, checked=True)

    def advance(self, now_s: float | None = None) -> list[Delivery]:
        """Read the replay's answers that arrived; once it is over (end marker, or past
        its deadline) deliver its batches and the live messages held meanwhile."""
        pending = self._replay
        if pending is None:
            return []
        if self.replay_waiting:
            self._send_replay_request(pending)
            if self.replay_waiting:
                return []
        if pending.socket is not None and not pending.answered:
            self._read_replies(pending)
        now_s = time.monotonic() if now_s is None else now_s
        if not pending.answered and now_s < pending.deadline_s:
            return []
        return self._finish(pending)

    def restart_from(self, seq: int | None) -> None:
        """Forget the stream's position (and any replay in flight): the next batch
        delivered resets the consumer's state, and (``seq`` given) batches from ``seq`` on
        are expected."""
        self._cancel_replay()
        self._tail_wanted = False
        self._next = seq
        self._stale = True
        self._recent.clear()

    def close(self) -> None:
        self._cancel_replay()
        self.socket.close(linger=0)

    # -- replay -----------------------------------------------------------------------
    def _wait(self) -> list[Delivery]:
        out: list[Delivery] = []
        while self._replay is not None:
            pending = self._replay
            if self.replay_waiting and not self._send_replay_request(pending):
                raise KVCacheRuntimeError(
                    "event subscriber: every replay slot is taken by other subscribers; "
                    "a subscriber sharing replay_slots must be driven by advance()"
                )
            if pending.socket is not None and not pending.answered:
                remaining_ms = max(0, int((pending.deadline_s - time.monotonic()) * 1000))
                pending.socket.poll(remaining_ms)
            out += self.advance()
        return out

    def _start_replay(
        self, start: int, live: tuple[int, bytes] | None, *, checked: bool
    ) -> list[Delivery]:
        """Ask for the batches from ``start``; checked: one batch earlier too, to tell
        whether the publisher is still the process whose batch ``start - 1`` we applied."""
        expected = self._recent.get(start - 1) if checked else None
        ask_from = start if expected is None else start - 1
        pending = PendingReplay(
            None, ask_from, start, expected, live, time.monotonic() + self.replay_timeout_s
        )
        self._replay = pending
        self._send_replay_request(pending)
        return self._finish(pending) if pending.answered else []

    def _send_replay_request(self, pending: PendingReplay) -> bool:
        """Open a DEALER and ask; False when no replay slot is free (the request waits).
        Without a replay endpoint the answer is none, at once; a socket that cannot be
        opened gives up the request at once, as if unanswered."""
        if self.replay_endpoint is None:
            pending.sent = pending.answered = True
            return True
        if self.replay_slots is not None and not self.replay_slots.acquire():
            return False
        pending.sent = True
        pending.holds_slot = self.replay_slots is not None
        pending.deadline_s = time.monotonic() + self.replay_timeout_s
        try:
            sock = self._ctx.socket(zmq.DEALER)
        except zmq.ZMQError:  # out of file descriptors (or of the context's sockets)
            pending.deadline_s = time.monotonic()
            return True
        pending.socket = sock
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVHWM, 0)
        sock.connect(self.replay_endpoint)
        sock.send_multipart((b"", pending.ask_from.to_bytes(8, "big")))
        return True

    def _read_replies(self, pending: PendingReplay) -> None:
        """Take the answers waiting; the deadline measures silence, so a long replay
        that keeps answering is not cut."""
        assert pending.socket is not None
        while True:
            try:
                frames = pending.socket.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            pending.deadline_s = time.monotonic() + self.replay_timeout_s
            if len(frames) != 4 or frames[0] != b"":
                continue
            if frames[2] == END_MARKER:
                pending.answered = True
                return
            if frames[1] == self.topic and len(frames[2]) == 8:
                pending.replies.append((int.from_bytes(frames[2], "big"), frames[3]))

    def _finish(self, pending: PendingReplay) -> list[Delivery]:
        self._cancel_replay()
        if self.replay_endpoint is not None:
            if pending.answered:
                self.replay_unanswered = 0
            else:
                self.num_replay_timeouts += 1
                self.replay_unanswered += 1
        replies = self._checked(pending)
        out: list[Delivery] = []
        if replies is None:
            # another process answers now (it numbered past our position before we heard
            # it): its batches from 0 on are the state, whatever we applied is void
            self._restarted()
            out += self._start_replay(0, pending.live, checked=False)
            return out + self._release_held()
        if pending.live is None:
            self._deliver_tail(replies, out)
        else:
            self._fill_gap(replies, pending.live, out)
        return out + self._release_held()

    def _release_held(self) -> list[Delivery]:
        out: list[Delivery] = []
        while self._replay is None and self._held:
            out += self.receive(self._held.popleft())
        if self._replay is None and self._tail_wanted:
            self._tail_wanted = False
            out += self.begin_tail()
        return out

    def _checked(self, pending: PendingReplay) -> list[tuple[int, bytes]] | None:
        """The replies from ``start`` on, or None if the batch before ``start`` is not the
        one applied (another batch there, or none though later ones exist)."""
        replies = sorted(pending.replies, key=lambda r: r[0])
        if pending.expected is None or not replies:
            return [r for r in replies if r[0] >= pending.start]
        first_seq, first_payload = replies[0]
        if first_seq == pending.ask_from and zlib.crc32(first_payload) == pending.expected:
            return replies[1:]
        if first_seq > pending.ask_from:
            return [r for r in replies if r[0] >= pending.start]  # our batch left its buffer
        return None

    def _deliver_tail(self, replies: list[tuple[int, bytes]], out: list[Delivery]) -> None:
        for seq, payload in replies:
            if self._next is not None and seq < self._next:
                continue
            if self._next is not None and seq > self._next:
                self._lose(seq - self._next)
            self._deliver(seq, payload, out)
            self.num_replayed += 1

    def _fill_gap(
        self, replies: list[tuple[int, bytes]], live: tuple[int, bytes], out: list[Delivery]
    ) -> None:
        live_seq, live_payload = live
        assert self._next is not None
        for seq, payload in replies:
            if seq < self._next or seq >= live_seq:
                continue
            if seq > self._next:
                self._lose(seq - self._next)
            self._deliver(seq, payload, out)
            self.num_recovered += 1
            self.num_replayed += 1
        if self._next < live_seq:
            self._lose(live_seq - self._next)
            self._next = live_seq
        self._deliver(live_seq, live_payload, out)

    def _cancel_replay(self) -> None:
        pending = self._replay
        self._replay = None
        if pending is None:
            return
        if pending.socket is not None:
            pending.socket.close(linger=0)
        if pending.holds_slot and self.replay_slots is not None:
            self.replay_slots.release()

    # -- state --------------------------------------------------------------------------
    def _deliver(self, seq: int, payload: bytes, out: list[Delivery]) -> None:
        self._next = seq + 1
        self._recent[seq] = zlib.crc32(payload)
        if len(self._recent) > _RECENT:
            self._recent.popitem(last=False)
        try:
            batch = decode_payload(payload)
        except KVCacheRuntimeError:
            self.num_decode_errors += 1
            self._stale = True
            return
        self.num_batches += 1
        out.append(Delivery(seq, batch, self._stale))
        self._stale = False

    def _restarted(self) -> None:
        self.num_restarts += 1
        self._stale = True
        self._recent.clear()
        self._next = 0

    def _lose(self, num_batches: int) -> None:
        self.num_lost += num_batches
        self._stale = True
