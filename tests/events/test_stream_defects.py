"""Event-stream failures a router meets in production, each reproduced: a publisher
restarted past the old sequence number, a dropped batch ending a burst, long replays,
data-parallel ports, events without ``group_idx``."""

from __future__ import annotations

import time

import pytest

pytest.importorskip("zmq")

from pagedkv.cluster import KVIndex
from pagedkv.events import EventSubscriber, KVEventsConfig, ZmqEventPublisher
from pagedkv.events.config import offset_endpoint_port
from pagedkv.events.wire import EventBatch, encode_event_batch
from pagedkv.runtime.events import BlockStored

from .helpers import free_port

pytestmark = pytest.mark.timeout(60)


def stored(*hashes: int) -> BlockStored:
    return BlockStored(
        block_hashes=list(hashes), parent_block_hash=None, token_ids=[1] * 4 * len(hashes),
        block_size=4, lora_id=None, medium="GPU", lora_name=None, group_idx=0,
    )  # fmt: skip


def wait_sent(pub: ZmqEventPublisher, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while pub.num_sent + pub.num_dropped < pub.num_published and time.monotonic() < deadline:
        time.sleep(0.005)


def test_a_restart_numbered_past_the_old_stream_is_detected() -> None:
    # The old process published 0..2 (block 111); we applied them. The new process has
    # published 0..5 (blocks 200..205) before we hear its batch 5 live.
    sub = EventSubscriber("tcp://127.0.0.1:1", None)  # live frames are handed in below
    index = KVIndex()
    for seq in range(3):
        for d in sub.handle(list(encode_event_batch([stored(111 + seq)], seq))):
            index.apply_batch("e", d.batch, d.reset)
    config = KVEventsConfig(endpoint="tcp://127.0.0.1:0", replay_endpoint="tcp://127.0.0.1:0")
    with ZmqEventPublisher(config, bind=True) as new:
        for seq in range(6):
            new.publish([stored(200 + seq)])
        wait_sent(new)
        sub.replay_endpoint = new.replay_endpoint
        frames = list(encode_event_batch([stored(205)], 5))
        for d in sub.handle(frames):
            index.apply_batch("e", d.batch, d.reset)
    sub.close()
    assert sub.num_restarts == 1
    assert index.engine_hashes("e") == {("GPU", 0): {200, 201, 202, 203, 204, 205}}


def test_a_dropped_batch_at_the_end_of_a_burst_is_noticed() -> None:
    config = KVEventsConfig(
        endpoint="tcp://127.0.0.1:0", replay_endpoint="tcp://127.0.0.1:0", max_queue_size=1
    )
    with ZmqEventPublisher(config, bind=True) as pub:
        sub = EventSubscriber(pub.endpoint, pub.replay_endpoint)
        for i in range(200):  # faster than the thread drains a one-slot queue
            pub.publish([stored(i)])
        assert pub.num_dropped > 0
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and pub.num_sent + pub.num_dropped < pub.num_published:
            time.sleep(0.01)
        time.sleep(0.1)
        out = sub.sync_tail()
        sub.close()
    # whatever was dropped, the last batch received is numbered after every drop
    assert sub.next_seq == pub.num_published
    assert sub.num_lost == pub.num_dropped and any(d.reset for d in out)


def test_long_replays_lose_nothing() -> None:
    steps = 3000
    config = KVEventsConfig(
        endpoint="tcp://127.0.0.1:0", replay_endpoint="tcp://127.0.0.1:0", buffer_steps=steps
    )
    with ZmqEventPublisher(config, bind=True) as pub:
        assert pub.replay_hwm == 2 * (steps + 1)  # vLLM's bound: a whole buffer fits
        for i in range(steps):
            pub.publish([stored(i)])
        wait_sent(pub)
        late = EventSubscriber(pub.endpoint, pub.replay_endpoint, replay_timeout_s=5.0)
        out = late.sync_tail()
        late.close()
    assert len(out) == steps and late.num_lost == 0


def test_data_parallel_ranks_publish_on_offset_ports() -> None:
    assert offset_endpoint_port("tcp://*:5557", 0) == "tcp://*:5557"
    assert offset_endpoint_port("tcp://*:5557", 2) == "tcp://*:5559"
    assert offset_endpoint_port("tcp://*:0", 3) == "tcp://*:0"
    assert offset_endpoint_port("inproc://kv", 1) == "inproc://kv_dp1"
    assert offset_endpoint_port(None, 1) is None
    # Four ports (base, base + 1, base + 10, base + 11) must be free; another process may take
    # one between the probe and the bind, so a clash retries on a fresh base.
    for _attempt in range(20):
        base = free_port()
        config = KVEventsConfig(
            endpoint=f"tcp://127.0.0.1:{base}", replay_endpoint=f"tcp://127.0.0.1:{base + 10}"
        )
        try:
            with (
                ZmqEventPublisher(config, bind=True) as rank0,
                ZmqEventPublisher(config, bind=True, data_parallel_rank=1) as rank1,
            ):
                assert rank0.endpoint.endswith(f":{base}")
                assert rank1.endpoint.endswith(f":{base + 1}")
                assert rank1.replay_endpoint == f"tcp://127.0.0.1:{base + 11}"
                return
        except OSError as error:
            if "Address already in use" not in str(error):
                raise
    pytest.fail("no four free ports found in 20 attempts")


def test_events_without_group_idx_count_as_group_zero() -> None:
    # vLLM before per-group events sent no group_idx: a router must still match them
    index = KVIndex()
    old = stored(1, 2, 3)
    old.group_idx = None
    index.apply_batch("old", EventBatch(ts=0.0, events=[old]))
    index.apply_batch("new", EventBatch(ts=0.0, events=[stored(1, 2)]))
    assert dict(zip(index.engines, index.prefix_blocks([1, 2, 3]))) == {"old": 3, "new": 2}
