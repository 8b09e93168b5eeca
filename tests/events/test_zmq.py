"""The publisher and subscriber on real loopback sockets, checked by the independent checker."""

from __future__ import annotations

import threading
import time

import pytest

zmq = pytest.importorskip("zmq")

from pagedkv.errors import ConfigError  # noqa: E402
from pagedkv.events import EventSubscriber, KVEventsConfig, ZmqEventPublisher  # noqa: E402
from pagedkv.runtime.events import AllBlocksCleared, BlockRemoved, BlockStored  # noqa: E402

from .helpers import LOOPBACK, cached_hashes, drive, small_manager  # noqa: E402
from .shared_tool import checker  # noqa: E402

pytestmark = pytest.mark.timeout(60)


def _publisher(**fields: object) -> ZmqEventPublisher:
    cfg = KVEventsConfig(endpoint=LOOPBACK, replay_endpoint=LOOPBACK, **fields)  # type: ignore[arg-type]
    return ZmqEventPublisher(cfg)


def _wait_sent(pub: ZmqEventPublisher, n: int, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while pub.num_sent < n and time.monotonic() < deadline:
        time.sleep(0.005)
    assert pub.num_sent >= n


def _wait_drained(pub: ZmqEventPublisher, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while pub.num_sent + pub.num_dropped < pub.num_published and time.monotonic() < deadline:
        time.sleep(0.005)
    assert pub.num_sent + pub.num_dropped == pub.num_published


def _apply(state: set[int], batches: list) -> None:
    for d in batches:
        if d.reset:
            state.clear()
        for ev in d.batch.events:
            if isinstance(ev, BlockStored):
                state.update(ev.block_hashes)
            elif isinstance(ev, BlockRemoved):
                state.difference_update(ev.block_hashes)
            elif isinstance(ev, AllBlocksCleared):
                state.clear()


@pytest.mark.parametrize("drop_every", [0, 3])
@pytest.mark.slow
def test_independent_checker_passes_with_and_without_drops(drop_every: int) -> None:
    manager = small_manager()
    with _publisher() as pub:
        sub = checker.Subscriber(
            pub.endpoint, pub.replay_endpoint, start_seq=0, drop_every=drop_every,
            replay_timeout=1.0, strict=True, min_batches=40,
        )  # fmt: skip
        result: dict = {}
        thread = threading.Thread(
            target=lambda: result.update(sub.run(until_idle=0.5, startup_wait=3))
        )
        thread.start()
        assert sub.ready.wait(5)
        time.sleep(0.2)  # let the SUB connect (a late join would be replayed anyway)
        for batch in drive(manager, 40):
            pub.publish(batch)
        thread.join(20)
        assert not thread.is_alive()
    assert result["ok"], result["failures"]
    assert result["decode_errors"] == 0 and result["batches"] == 40
    assert result["stored"]["hash_types"].keys() == {"int"}
    if drop_every:
        assert result["messages"]["dropped_simulated"] > 0
        assert result["gaps"]["recovered_batches"] + result["gaps"]["tail_recovered_batches"] > 0
    (stored,) = sub.stored_hashes().values()
    assert stored == cached_hashes(manager)


def test_subscriber_recovers_dropped_batches_through_replay() -> None:
    manager = small_manager()
    with _publisher() as pub:
        sub = EventSubscriber(pub.endpoint, pub.replay_endpoint)
        time.sleep(0.2)  # let the SUB connect
        batches = drive(manager, 30)
        for batch in batches:
            pub.publish(batch)
        _wait_sent(pub, len(batches))
        state: set[int] = set()
        received = 0
        deadline = time.monotonic() + 5
        while received < len(batches) and time.monotonic() < deadline:
            try:
                frames = sub.socket.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                time.sleep(0.01)
                continue
            received += 1
            if received % 4 == 0:
                continue  # injected loss
            _apply(state, sub.handle(frames))
        _apply(state, sub.sync_tail())
        sub.close()
    assert sub.num_gaps > 0 and sub.num_recovered > 0 and sub.num_lost == 0
    assert sub.num_batches == len(batches) and sub.next_seq == len(batches)
    assert state == cached_hashes(manager)


def test_late_join_replays_history_and_restart_resets_state() -> None:
    manager = small_manager()
    with _publisher() as pub:
        for batch in drive(manager, 10):
            pub.publish(batch)
        _wait_sent(pub, 10)
        sub = EventSubscriber(pub.endpoint, pub.replay_endpoint, start_seq=0)
        state: set[int] = set()
        _apply(state, sub.sync_tail())
        assert sub.next_seq == 10 and state == cached_hashes(manager)
    # The engine restarts: a new publisher numbers from 0 again on the same socket.
    fresh = small_manager()
    first = drive(fresh, 3, seed=7)
    frames = [b"", (0).to_bytes(8, "big"), _payload(first[0])]
    deliveries = sub.handle(frames)
    assert sub.num_restarts == 1 and deliveries[0].reset
    _apply(state, deliveries)
    assert state <= cached_hashes(fresh)
    sub.close()


def _payload(events: list) -> bytes:
    from pagedkv.events.wire import encode_payload

    return encode_payload(events)


def test_full_queue_drops_and_the_loss_is_visible_as_a_gap() -> None:
    manager = small_manager()
    cfg = KVEventsConfig(endpoint=LOOPBACK, replay_endpoint=LOOPBACK, max_queue_size=1)
    pub = ZmqEventPublisher(cfg)
    try:
        sub = EventSubscriber(pub.endpoint, pub.replay_endpoint)
        batches = drive(manager, 50)
        for batch in batches:  # faster than the thread drains a one-slot queue
            pub.publish(batch)
        # (an empty batch may follow a drop that emptied the queue: see the publisher)
        assert pub.num_published >= 50 and pub.num_dropped > 0
        _wait_drained(pub)
        pub.publish([AllBlocksCleared()])  # the next batch that gets through shows the gap
        _wait_drained(pub)
        out = sub.sync_tail()
        assert sub.num_lost == pub.num_dropped and any(d.reset for d in out)
        sub.close()
    finally:
        pub.close()


def test_replay_ignores_malformed_requests_and_answers_with_the_end_marker() -> None:
    with _publisher(buffer_steps=3) as pub:
        for i in range(5):
            pub.publish([BlockRemoved(block_hashes=[i], medium="GPU")])
        _wait_sent(pub, 5)
        ctx = zmq.Context.instance()
        dealer = ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.connect(pub.replay_endpoint)
        dealer.send_multipart([b"", b"bad"])
        dealer.send_multipart([b"", (0).to_bytes(8, "big")])
        replies = []
        while dealer.poll(2000):
            frames = dealer.recv_multipart()
            replies.append(frames)
            if frames[2] == b"\xff" * 8:
                break
        dealer.close()
    assert [int.from_bytes(f[2], "big") for f in replies[:-1]] == [2, 3, 4]  # bounded buffer
    assert replies[-1] == [b"", b"", b"\xff" * 8, b""]


def test_config_is_validated() -> None:
    with pytest.raises(ConfigError, match="endpoint"):
        KVEventsConfig(endpoint="localhost:5557")
    with pytest.raises(ConfigError, match="buffer_steps"):
        KVEventsConfig(buffer_steps=0)
    with pytest.raises(ConfigError, match="hwm"):
        KVEventsConfig(hwm=-1)
