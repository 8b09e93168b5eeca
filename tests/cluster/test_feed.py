"""IndexFeed's idle tail sync against an engine whose replay endpoint never answers."""

from __future__ import annotations

import time

import pytest

zmq = pytest.importorskip("zmq")

from pagedkv.cluster import KVIndex  # noqa: E402
from pagedkv.cluster.feed import EngineEndpoints, IndexFeed  # noqa: E402

pytestmark = pytest.mark.timeout(30)


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
