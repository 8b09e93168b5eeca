"""IndexFeed against engines whose replay endpoint never answers: its idle tail sync
backs off, and a replay waiting for an answer holds no other engine's batches."""

from __future__ import annotations

import time

import pytest

zmq = pytest.importorskip("zmq")

from pagedkv.cluster import KVIndex  # noqa: E402
from pagedkv.cluster.feed import EngineEndpoints, IndexFeed  # noqa: E402
from pagedkv.events.publisher import END_MARKER  # noqa: E402
from pagedkv.events.wire import encode_event_batch  # noqa: E402

from .helpers import stored, wait_for  # noqa: E402

pytestmark = pytest.mark.timeout(30)


@pytest.mark.slow
def test_a_silent_replay_endpoint_is_asked_less_and_less_often() -> None:
    # Each unanswered ask holds the feed thread for replay_timeout_s: asking every
    # idle_sync_s would leave the live engines' batches waiting most of the time.
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    silent = ctx.socket(zmq.ROUTER)  # accepts replay requests, never answers
    try:
        pub.bind("tcp://127.0.0.1:*")
        silent.bind("tcp://127.0.0.1:*")
        ends = EngineEndpoints(
            pub.getsockopt_string(zmq.LAST_ENDPOINT), silent.getsockopt_string(zmq.LAST_ENDPOINT)
        )
        feed = IndexFeed(KVIndex(), {"a": ends}, idle_sync_s=0.02, replay_timeout_s=0.05)
        with feed:
            time.sleep(1.5)
            timeouts = feed._subs["a"].num_replay_timeouts
        # backoff: asks at about 0.02, 0.09, 0.2, 0.41, 0.78, 1.49 s; without: over 20
        assert 1 <= timeouts <= 8
    finally:
        pub.close(linger=0)
        silent.close(linger=0)
        ctx.term()


def test_an_unanswered_replay_does_not_hold_other_engines_batches() -> None:
    # Engine "dead" shows a gap (its first batch is seq 5) and its replay endpoint takes
    # the request and never answers; the replay waits up to 600 s. Engine "live"'s batch
    # must be applied while that replay is still pending; once "dead" answers, its held
    # live batch comes after the replayed ones, in order, nothing lost.
    ctx = zmq.Context()
    dead_pub, live_pub = ctx.socket(zmq.PUB), ctx.socket(zmq.PUB)
    dead_replay = ctx.socket(zmq.ROUTER)
    try:
        for sock in (dead_pub, live_pub, dead_replay):
            sock.bind("tcp://127.0.0.1:*")
        address = {s: s.getsockopt_string(zmq.LAST_ENDPOINT) for s in (dead_pub, live_pub)}
        engines = {
            "dead": EngineEndpoints(
                address[dead_pub], dead_replay.getsockopt_string(zmq.LAST_ENDPOINT)
            ),
            "live": EngineEndpoints(address[live_pub]),
        }
        index = KVIndex()
        feed = IndexFeed(index, engines, idle_sync_s=3600.0, replay_timeout_s=600.0)
        with feed:
            gap_batch = encode_event_batch([stored(105)], 5)
            while not dead_replay.poll(20):  # until "dead"'s SUB is connected and asks
                dead_pub.send_multipart(gap_batch)
            identity, _, start = dead_replay.recv_multipart()
            assert int.from_bytes(start, "big") == 0
            # "dead"'s replay is pending; "live" publishes (again until its SUB hears it)
            live_batch = encode_event_batch([stored(7)], 0)

            def live_applied() -> bool:
                live_pub.send_multipart(live_batch)
                return feed.stats()["live"].batches == 1

            wait_for(live_applied, "live's batch while dead's replay is pending")
            dead = feed.stats()["dead"]
            assert dead.replay_pending and dead.batches == 0
            assert index.holders(7) == ["live"] and index.holders(105) == []
            # "dead" answers at last: batches 0-4, then the end marker
            for seq in range(5):
                _, seq_bytes, payload = encode_event_batch([stored(100 + seq)], seq)
                dead_replay.send_multipart((identity, b"", b"", seq_bytes, payload))
            dead_replay.send_multipart((identity, b"", b"", END_MARKER, b""))
            wait_for(lambda: feed.stats()["dead"].batches == 6, "dead's batches")
            dead = feed.stats()["dead"]
            assert dead.next_seq == 6 and dead.lost == 0 and not dead.replay_pending
            assert all(index.holders(h) == ["dead"] for h in range(100, 106))
    finally:
        for sock in (dead_pub, live_pub, dead_replay):
            sock.close(linger=0)
        ctx.term()
