"""The router's /metrics on a live feed: it parses, counters are counters, and the
feed's gap, recovery, loss, restart, replay, decode-error and age series move when a
stream misbehaves."""

from __future__ import annotations

import time

import pytest

zmq = pytest.importorskip("zmq")
pytest.importorskip("starlette")
pytest.importorskip("prometheus_client")
pytest.importorskip("httpx")

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402
from starlette.testclient import TestClient  # noqa: E402

from pagedkv.cluster import KVIndex, PromptHasher, make_router  # noqa: E402
from pagedkv.cluster.feed import EngineEndpoints, IndexFeed  # noqa: E402
from pagedkv.cluster.service import RouteService, create_app  # noqa: E402
from pagedkv.events.publisher import END_MARKER  # noqa: E402
from pagedkv.events.wire import encode_event_batch  # noqa: E402

from .helpers import stored, wait_for  # noqa: E402

pytestmark = pytest.mark.timeout(60)
COUNTERS = ("batches", "gaps", "recovered", "replayed", "lost", "restarts", "replay_timeouts")
Scrape = dict[str, tuple[str, dict[str, float]]]  # family -> (type, engine or "" -> value)


def _scrape(client: TestClient) -> Scrape:
    """Every family of /metrics, parsed by prometheus-client's own parser."""
    out: Scrape = {}
    for family in text_string_to_metric_families(client.get("/metrics").text):
        value_name = f"{family.name}_total" if family.type == "counter" else family.name
        values = {
            s.labels.get("engine", ""): s.value for s in family.samples if s.name == value_name
        }
        out[family.name] = (family.type, values)
    return out


def _service(feed: IndexFeed) -> TestClient:
    service = RouteService(
        feed.index, make_router("prefix"), PromptHasher(4), list(feed.engines), feed
    )
    return TestClient(create_app(service))


def test_gaps_restarts_replays_and_event_age_on_metrics() -> None:
    ctx = zmq.Context()
    pub, replay = ctx.socket(zmq.PUB), ctx.socket(zmq.ROUTER)  # the test answers replays
    try:
        for sock in (pub, replay):
            sock.bind("tcp://127.0.0.1:*")
        ends = EngineEndpoints(*(s.getsockopt_string(zmq.LAST_ENDPOINT) for s in (pub, replay)))
        feed = IndexFeed(KVIndex(), {"a": ends}, idle_sync_s=3600.0, replay_timeout_s=600.0)
        with feed:
            client = _service(feed)
            old = encode_event_batch([stored(1)], 0, ts=time.time() - 1000.0)

            def first_applied() -> bool:
                pub.send_multipart(old)  # again until the SUB hears it (duplicates are dropped)
                return feed.stats()["a"].batches == 1

            wait_for(first_applied, "the first batch")
            before = _scrape(client)
            for name in COUNTERS:
                assert before[f"pagedkv_feed_{name}"][0] == "counter", name
            assert before["pagedkv_index_evictions"][0] == "counter"
            for name in ("event_age_seconds", "seconds_since_batch", "replays_open"):
                assert before[f"pagedkv_feed_{name}"][0] == "gauge", name
            assert before["pagedkv_feed_batches"][1] == {"a": 1.0}
            assert before["pagedkv_feed_event_age_seconds"][1]["a"] >= 1000.0
            assert before["pagedkv_feed_seconds_since_batch"][1]["a"] >= 0.0
            assert before["pagedkv_feed_replays_open"][1] == {"": 0.0}

            # seq 1 is missed: the gap is asked by replay, which stays open until answered
            pub.send_multipart(encode_event_batch([stored(3)], 2, ts=time.time()))
            identity, _, start = replay.recv_multipart()
            assert int.from_bytes(start, "big") == 0  # one batch early, to check it
            during = _scrape(client)
            assert during["pagedkv_feed_gaps"][1] == {"a": 1.0}
            assert during["pagedkv_feed_replays_open"][1] == {"": 1.0}
            # it gives back seq 0 (the batch applied) but no longer has seq 1
            _, seq0, payload0 = old
            replay.send_multipart((identity, b"", b"", seq0, payload0))
            replay.send_multipart((identity, b"", b"", END_MARKER, b""))
            wait_for(lambda: feed.stats()["a"].batches == 2, "the batch after the gap")
            after_gap = _scrape(client)
            assert after_gap["pagedkv_feed_lost"][1] == {"a": 1.0}
            # the replay gave back only the batch already applied: nothing came by replay
            assert after_gap["pagedkv_feed_recovered"][1] == {"a": 0.0}
            assert after_gap["pagedkv_feed_replayed"][1] == {"a": 0.0}
            assert after_gap["pagedkv_feed_replays_open"][1] == {"": 0.0}
            assert after_gap["pagedkv_feed_event_age_seconds"][1]["a"] < 500.0

            # another process numbers from 0 again: a restart
            new0 = encode_event_batch([stored(9)], 0, ts=time.time())
            pub.send_multipart(new0)
            wait_for(lambda: feed.stats()["a"].restarts == 1, "the restart")
            restarted = _scrape(client)
            assert restarted["pagedkv_feed_restarts"][1] == {"a": 1.0}
            assert restarted["pagedkv_feed_batches"][1] == {"a": 3.0}
            assert restarted["pagedkv_feed_replay_timeouts"][1] == {"a": 0.0}

            # seq 1 of the new process is missed too, and this time replay has it
            new1 = encode_event_batch([stored(10)], 1, ts=time.time())
            pub.send_multipart(encode_event_batch([stored(11)], 2, ts=time.time()))
            identity, _, start = replay.recv_multipart()
            assert int.from_bytes(start, "big") == 0
            for _, seq, payload in (new0, new1):
                replay.send_multipart((identity, b"", b"", seq, payload))
            replay.send_multipart((identity, b"", b"", END_MARKER, b""))
            wait_for(lambda: feed.stats()["a"].batches == 5, "the recovered batch")
            recovered = _scrape(client)
            assert recovered["pagedkv_feed_gaps"][1] == {"a": 2.0}
            assert recovered["pagedkv_feed_recovered"][1] == {"a": 1.0}
            assert recovered["pagedkv_feed_replayed"][1] == {"a": 1.0}
            assert recovered["pagedkv_feed_lost"][1] == {"a": 1.0}

            # a message that is not (topic, 8-byte seq, payload)
            assert recovered["pagedkv_feed_decode_errors"][1] == {"a": 0.0}
            pub.send_multipart((old[0], b"short", b""))
            wait_for(lambda: feed.stats()["a"].decode_errors == 1, "the malformed message")
            malformed = _scrape(client)
            assert malformed["pagedkv_feed_decode_errors"][1] == {"a": 1.0}
            assert malformed["pagedkv_feed_batches"][1] == {"a": 5.0}
    finally:
        for sock in (pub, replay):
            sock.close(linger=0)
        ctx.term()


def test_unanswered_replays_are_counted_on_metrics() -> None:
    ctx = zmq.Context()
    pub, silent = ctx.socket(zmq.PUB), ctx.socket(zmq.ROUTER)  # replays never answered
    try:
        for sock in (pub, silent):
            sock.bind("tcp://127.0.0.1:*")
        ends = EngineEndpoints(*(s.getsockopt_string(zmq.LAST_ENDPOINT) for s in (pub, silent)))
        feed = IndexFeed(KVIndex(), {"a": ends}, idle_sync_s=0.05, replay_timeout_s=0.05)
        with feed:
            client = _service(feed)
            wait_for(lambda: feed.stats()["a"].replay_timeouts >= 1, "an unanswered replay")
            scraped = _scrape(client)
            assert scraped["pagedkv_feed_replay_timeouts"][0] == "counter"
            assert scraped["pagedkv_feed_replay_timeouts"][1]["a"] >= 1.0
            assert scraped["pagedkv_feed_replay_unanswered"][1]["a"] >= 1.0
    finally:
        for sock in (pub, silent):
            sock.close(linger=0)
        ctx.term()
