"""Read one publisher's KV event stream (pagedkv's or vLLM's) in order, losses repaired.

Sequence numbers must be contiguous. A gap is asked from the publisher's replay endpoint
(a fresh DEALER per request: ``[b"", start]`` out, ``[b"", topic, seq, payload]`` back
until the end marker). What replay cannot give back is lost for good: the next batch is
delivered with ``reset=True`` so the consumer drops that engine's state and rebuilds it
from the events that follow. A sequence number that goes back with another payload means
the publisher restarted: also ``reset=True``, and the new stream is read from 0.
"""

from __future__ import annotations

import zlib
from collections import OrderedDict
from typing import NamedTuple

import zmq

from pagedkv.errors import KVCacheRuntimeError
from pagedkv.events.publisher import END_MARKER
from pagedkv.events.wire import EventBatch, decode_payload

_RECENT = 4096  # checksums of recently applied batches (to tell duplicates from restarts)


class Delivery(NamedTuple):
    """One batch in order; ``reset``: discard the engine's state before applying it."""

    seq: int
    batch: EventBatch
    reset: bool


class EventSubscriber:
    """A SUB socket (plus replay requests) for one publisher; sockets belong to the thread
    that calls ``poll``/``handle``/``sync_tail``. ``start_seq=0`` replays a late join from
    the publisher's first batch; None starts at the first batch received."""

    def __init__(
        self,
        endpoint: str,
        replay_endpoint: str | None = None,
        topic: str = "",
        *,
        bind: bool | None = None,
        start_seq: int | None = 0,
        replay_timeout_s: float = 1.0,
        context: zmq.Context | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.replay_endpoint = replay_endpoint
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
        self.num_batches = self.num_gaps = self.num_recovered = self.num_lost = 0
        self.num_restarts = self.num_duplicates = self.num_decode_errors = 0
        self.num_replay_timeouts = 0
        self.num_replayed = 0  # batches delivered from replay (gaps and tails)

    @property
    def next_seq(self) -> int | None:
        """The sequence number expected next (None before the first batch)."""
        return self._next

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
        """One live message (three frames) -> the batches it makes deliverable."""
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
            out += self._fill_gap(seq)
        self._deliver(seq, payload, out)
        return out

    def sync_tail(self) -> list[Delivery]:
        """Ask the replay endpoint for everything after the last batch seen (a lost tail)."""
        out: list[Delivery] = []
        start = self._next or 0
        replies = self._replay_checked(start)
        if replies is None:  # another process answers now: read its stream from the start
            self._restarted()
            replies = self._replay(0)
        for seq, payload in replies:
            if self._next is not None and seq < self._next:
                continue
            if self._next is not None and seq > self._next:
                self._lose(seq - self._next)
            self._deliver(seq, payload, out)
            self.num_replayed += 1
        return out

    def restart_from(self, seq: int | None) -> None:
        """Forget the stream's position: the next batch delivered resets the consumer's
        state, and (``seq`` given) batches from ``seq`` on are expected."""
        self._next = seq
        self._stale = True
        self._recent.clear()

    def close(self) -> None:
        self.socket.close(linger=0)

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

    def _fill_gap(self, live_seq: int) -> list[Delivery]:
        assert self._next is not None
        self.num_gaps += 1
        out: list[Delivery] = []
        replies = self._replay_checked(self._next)
        if replies is None:
            # a new process numbered past our position before we heard it: its batches
            # from 0 on are the state, whatever we applied from the old one is void
            self._restarted()
            replies = self._replay(0)
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
        return out

    def _replay_checked(self, start: int) -> list[tuple[int, bytes]] | None:
        """Replay from ``start``, asking one batch earlier to check that the publisher is
        still the process whose batch ``start - 1`` we applied: None if it is not (its
        batch there differs, or it has none though it has later ones)."""
        last = start - 1
        expected = self._recent.get(last)
        if expected is None:
            return self._replay(start)
        replies = self._replay(last)
        if not replies:
            return replies
        first_seq, first_payload = replies[0]
        if first_seq == last and zlib.crc32(first_payload) == expected:
            return replies[1:]
        if first_seq > last:
            return [r for r in replies if r[0] >= start]  # our batch left its buffer
        return None

    def _restarted(self) -> None:
        self.num_restarts += 1
        self._stale = True
        self._recent.clear()
        self._next = 0

    def _lose(self, num_batches: int) -> None:
        self.num_lost += num_batches
        self._stale = True

    def _replay(self, start: int) -> list[tuple[int, bytes]]:
        if self.replay_endpoint is None:
            return []
        sock = self._ctx.socket(zmq.DEALER)
        replies: list[tuple[int, bytes]] = []
        try:
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.RCVHWM, 0)
            sock.connect(self.replay_endpoint)
            sock.send_multipart((b"", start.to_bytes(8, "big")))
            timeout_ms = int(self.replay_timeout_s * 1000)
            while True:
                if not sock.poll(timeout_ms):
                    self.num_replay_timeouts += 1
                    break
                frames = sock.recv_multipart()
                if len(frames) != 4 or frames[0] != b"":
                    continue
                if frames[2] == END_MARKER:
                    break
                if frames[1] == self.topic and len(frames[2]) == 8:
                    replies.append((int.from_bytes(frames[2], "big"), frames[3]))
        finally:
            sock.close(linger=0)
        replies.sort(key=lambda r: r[0])
        return replies
