"""Publish KV cache events over ZeroMQ the way vLLM 0.33 does, without blocking the engine.

``publish`` numbers the batch and hands it to a bounded queue; a publisher thread owns
the sockets: it encodes each batch, sends it on the PUB socket, keeps the last
``buffer_steps`` payloads, and answers replay requests on the ROUTER socket. A batch
that finds the queue full is dropped and counted; its sequence number is used anyway,
so subscribers see the loss as a gap (replay cannot fill it) instead of missing it.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections import deque
from collections.abc import Sequence
from typing import Any

import zmq

from pagedkv.events.config import KVEventsConfig, binds, offset_endpoint_port
from pagedkv.events.wire import END_OF_REPLAY_SEQ, encode_payload
from pagedkv.runtime.events import KVCacheEvent

__all__ = [
    "END_MARKER",
    "ZmqEventPublisher",
]

END_MARKER = END_OF_REPLAY_SEQ.to_bytes(8, "big", signed=True)
_POLL_MS = 5
_STOP = object()


class ZmqEventPublisher:
    """PUB socket + replay ROUTER + bounded queue + publisher thread (see module doc).

    ``endpoint`` / ``replay_endpoint`` are the addresses actually bound (a ``*`` port
    resolved), for subscribers to use; data-parallel rank ``r`` publishes on the
    configured ports plus ``r`` (vLLM's offsets). ``bind`` None: bind or connect the PUB
    socket by vLLM's rule (``binds``); True binds any address (``tcp://127.0.0.1:5557``
    for loopback only). ``close()`` sends what is queued, then stops.

    Args:
        config: endpoints, topic, queue and replay buffer sizes (None: the defaults).
        data_parallel_rank: this engine's data-parallel rank, added to the configured ports.
        int_block_hashes: send block hashes as integers (False: as bytes).
        startup_timeout_s: seconds to wait for the sockets to be ready before raising OSError.
        bind: bind (True) or connect (False) the PUB socket (None: vLLM's rule for the endpoint).
    """

    def __init__(
        self,
        config: KVEventsConfig | None = None,
        *,
        data_parallel_rank: int = 0,
        int_block_hashes: bool = True,
        startup_timeout_s: float = 5.0,
        bind: bool | None = None,
    ) -> None:
        self.config = config or KVEventsConfig()
        self.bind = binds(self.config.endpoint) if bind is None else bind
        self.data_parallel_rank = data_parallel_rank
        self.int_block_hashes = int_block_hashes
        self.num_published = 0  # sequence numbers handed out
        self.num_dropped = 0  # batches dropped because the queue was full
        self.num_sent = 0  # batches sent on the PUB socket
        self.num_replay_requests = 0
        self._topic = self.config.topic.encode("utf-8")
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=self.config.max_queue_size)
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=self.config.buffer_steps)
        self._lock = threading.Lock()
        # a batch was dropped and no later batch has been sent since: subscribers cannot
        # see the gap yet (the thread sends an empty batch after it, see _mark_drop)
        self._drop_unseen = False
        self.replay_hwm = 2 * (self.config.buffer_steps + 1)
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self.endpoint = offset_endpoint_port(self.config.endpoint, data_parallel_rank) or ""
        self.replay_endpoint = offset_endpoint_port(self.config.replay_endpoint, data_parallel_rank)
        self._ctx = zmq.Context()
        self._thread = threading.Thread(target=self._run, name="pagedkv-kv-events", daemon=True)
        self._thread.start()
        if not self._ready.wait(startup_timeout_s) or self._error is not None:
            self.close(timeout_s=1.0)
            raise OSError(f"KV event publisher could not start on {self.endpoint}: {self._error}")

    def publish(self, events: Sequence[KVCacheEvent]) -> int:
        """Queue one batch (one engine step); returns its sequence number. Never blocks."""
        with self._lock:  # numbered and queued together, so the thread's markers fit in
            seq = self.num_published
            self.num_published += 1
            try:
                self._queue.put_nowait((seq, list(events)))
            except queue.Full:
                self.num_dropped += 1
                self._drop_unseen = True
        return seq

    def close(self, timeout_s: float = 5.0) -> None:
        """Send what is queued (up to ``timeout_s``), then close the sockets."""
        if self._thread.is_alive():
            with contextlib.suppress(queue.Full):
                self._queue.put(_STOP, timeout=timeout_s)
            self._thread.join(timeout_s)
        self._ctx.destroy(linger=0)

    def __enter__(self) -> ZmqEventPublisher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- publisher thread -------------------------------------------------------------
    def _open(self) -> tuple[zmq.Socket[bytes], zmq.Socket[bytes] | None]:
        cfg = self.config
        pub = self._ctx.socket(zmq.PUB)
        pub.setsockopt(zmq.SNDHWM, cfg.hwm)
        pub.setsockopt(zmq.LINGER, 1000)
        if self.bind:
            pub.bind(self.endpoint)
            self.endpoint = pub.getsockopt_string(zmq.LAST_ENDPOINT)
        else:
            pub.connect(self.endpoint)
        replay = None
        if self.replay_endpoint is not None:
            replay = self._ctx.socket(zmq.ROUTER)
            replay.setsockopt(zmq.LINGER, 0)
            # a whole buffer's replay (plus its end marker) must fit in the send queue,
            # or ZeroMQ drops the tail of a long replay (vLLM's bound)
            replay.setsockopt(zmq.SNDHWM, self.replay_hwm)
            replay.bind(self.replay_endpoint)
            self.replay_endpoint = replay.getsockopt_string(zmq.LAST_ENDPOINT)
        return pub, replay

    def _run(self) -> None:
        try:
            pub, replay = self._open()
        except zmq.ZMQError as exc:
            self._error = exc
            self._ready.set()
            return
        self._ready.set()
        try:
            while True:
                if replay is not None and replay.poll(0):
                    self._answer_replay(replay)
                try:
                    item = self._queue.get(timeout=_POLL_MS / 1000)
                except queue.Empty:
                    if self._drop_unseen:
                        self._mark_drop(pub)
                    continue
                if item is _STOP:
                    if self._drop_unseen:
                        self._mark_drop(pub)
                    break
                self._send(pub, *item)
                if self._queue.empty() and self._drop_unseen:
                    self._mark_drop(pub)
        finally:
            pub.close()
            if replay is not None:
                replay.close()

    def _send(self, pub: zmq.Socket[bytes], seq: int, events: list[KVCacheEvent]) -> None:
        payload = encode_payload(
            events,
            data_parallel_rank=self.data_parallel_rank,
            int_block_hashes=self.int_block_hashes,
        )
        self._buffer.append((seq, payload))
        pub.send_multipart((self._topic, seq.to_bytes(8, "big"), payload))
        self.num_sent += 1

    def _mark_drop(self, pub: zmq.Socket[bytes]) -> None:
        """Send an empty batch numbered after a dropped one that ended a burst, so the
        subscribers see the gap (and drop the state it voids) instead of waiting for the
        engine's next step to reveal it."""
        with self._lock:
            if not self._queue.empty():
                return  # a later batch will reveal the gap
            seq = self.num_published
            self.num_published += 1
            self._drop_unseen = False
        self._send(pub, seq, [])

    def _answer_replay(self, replay: zmq.Socket[bytes]) -> None:
        while replay.poll(0):
            frames = replay.recv_multipart()
            if len(frames) != 3 or frames[1] != b"" or len(frames[2]) != 8:
                continue  # not [identity, b"", start_seq]: ignored, as vLLM does
            identity, start = frames[0], int.from_bytes(frames[2], "big")
            self.num_replay_requests += 1
            for seq, payload in list(self._buffer):
                if seq >= start:
                    replay.send_multipart(
                        (identity, b"", self._topic, seq.to_bytes(8, "big"), payload)
                    )
            replay.send_multipart((identity, b"", b"", END_MARKER, b""))
