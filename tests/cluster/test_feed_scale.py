"""The feed at fleet scale: file descriptors checked up front and never run out of (a
sync of every engine included), more than 1,023 engines, replay requests capped."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

zmq = pytest.importorskip("zmq")
resource = pytest.importorskip("resource")

import pagedkv  # noqa: E402
from events.helpers import LOOPBACK  # noqa: E402
from pagedkv.cluster import KVIndex  # noqa: E402
from pagedkv.cluster.feed import (  # noqa: E402
    EngineEndpoints,
    IndexFeed,
    descriptors_needed,
    reserve_descriptors,
)
from pagedkv.errors import ConfigError  # noqa: E402
from pagedkv.events import KVEventsConfig, ZmqEventPublisher  # noqa: E402
from pagedkv.events.replay_slots import ReplaySlots  # noqa: E402
from pagedkv.events.subscriber import EventSubscriber  # noqa: E402

pytestmark = pytest.mark.timeout(120)

# Runs in a child process whose open-file limit is lowered to `limit` (soft and hard,
# so the feed cannot raise it): starts a feed for `n` engines and syncs it twice.
_CHILD = textwrap.dedent(
    """
    import resource, sys
    from pagedkv.cluster import KVIndex
    from pagedkv.cluster.feed import EngineEndpoints, IndexFeed
    from pagedkv.errors import ConfigError
    pub, replay, n, limit = sys.argv[1], sys.argv[2] or None, int(sys.argv[3]), int(sys.argv[4])
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))
    engines = {f"e{i}": EngineEndpoints(pub, replay) for i in range(n)}
    feed = IndexFeed(KVIndex(), engines, idle_sync_s=3600.0, replay_timeout_s=5.0)
    try:
        feed.start(timeout_s=60)
    except ConfigError as exc:
        print("CONFIG", exc)
        sys.exit(3)
    synced = feed.sync(timeout_s=60) and feed.sync(timeout_s=60)
    print("SYNCED", synced, "ALIVE", feed.alive, "ERROR", repr(feed.error))
    feed.stop()
    """
)


def _run_child(endpoint: str, replay: str | None, num_engines: int, limit: int) -> str:
    src = str(Path(pagedkv.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    args = [sys.executable, "-c", _CHILD, endpoint, replay or "", str(num_engines), str(limit)]
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=100)
    return done.stdout + done.stderr


@pytest.mark.slow
def test_a_sync_of_every_engine_fits_the_descriptors_reserved() -> None:
    # A sync (or every quiet engine's idle tail) asks every engine's replay endpoint at
    # once: with a DEALER each, 200 engines held 800 descriptors and the feed thread died
    # on "Too many open files" under a limit its start-up check had accepted.
    num_engines = 200
    limit = descriptors_needed(num_engines)
    config = KVEventsConfig(endpoint=LOOPBACK, replay_endpoint=LOOPBACK)
    with ZmqEventPublisher(config) as pub:  # every engine subscribes to this one
        out = _run_child(pub.endpoint, pub.replay_endpoint, num_engines, limit)
    assert "SYNCED True ALIVE True ERROR None" in out, out


@pytest.mark.slow
def test_too_many_engines_for_the_limit_fail_at_start_naming_it() -> None:
    out = _run_child("tcp://127.0.0.1:9", None, 1000, 1024)
    need = descriptors_needed(1000)
    assert f"CONFIG index feed: 1000 engines need about {need} open files" in out, out
    assert "RLIMIT_NOFILE" in out and f"ulimit -n {need}" in out


def test_too_few_descriptors_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(resource, "getrlimit", lambda _: (1024, 1024))

    def refuse(*_: object) -> None:
        raise ValueError("not allowed")

    monkeypatch.setattr(resource, "setrlimit", refuse)
    assert descriptors_needed(400) == 2 * (400 + 32) + 64
    reserve_descriptors(400)  # fits
    with pytest.raises(ConfigError, match=r"1000 engines need about 2128 open files"):
        reserve_descriptors(1000)
    with pytest.raises(ConfigError, match="about 2066 open files"):
        reserve_descriptors(1000, max_replays=1)
    with pytest.raises(ConfigError, match="max_replays"):
        IndexFeed(KVIndex(), {}, max_replays=0)


def test_replays_past_the_shared_slots_wait_their_turn() -> None:
    ctx = zmq.Context()
    silent = ctx.socket(zmq.ROUTER)  # accepts replay requests, never answers
    slots = ReplaySlots(1)
    subs: list[EventSubscriber] = []
    try:
        silent.bind(LOOPBACK)
        replay = silent.getsockopt_string(zmq.LAST_ENDPOINT)
        subs = [
            EventSubscriber("tcp://127.0.0.1:9", replay, replay_slots=slots, context=ctx)
            for _ in range(2)
        ]
        first, second = subs
        assert first.begin_tail() == [] and second.begin_tail() == []
        assert first.replay_socket is not None and not first.replay_waiting
        assert second.replay_waiting and second.replay_socket is None
        assert second.replay_deadline_s is None and second.advance() == []
        assert second.replay_waiting and slots.free == 0
        deadline = first.replay_deadline_s
        assert deadline is not None
        first.advance(now_s=deadline)  # given up: its slot goes back
        assert first.num_replay_timeouts == 1 and not first.replay_in_flight
        assert slots.free == 1
        second.advance()
        assert second.replay_socket is not None and slots.free == 0
        second.restart_from(0)  # cancelling a replay frees its slot too
        assert slots.free == 1 and not second.replay_in_flight
    finally:
        for sub in subs:
            sub.close()
        silent.close(linger=0)
        ctx.term()


def test_more_than_1023_engines_start() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < descriptors_needed(1100):
        pytest.skip(f"hard open-file limit {hard}")
    engines = {f"e{i}": EngineEndpoints(f"tcp://127.0.0.1:{20000 + i}") for i in range(1100)}
    feed = IndexFeed(KVIndex(), engines, idle_sync_s=3600.0)
    try:
        feed.start(timeout_s=60)
        assert feed.alive and len(feed.stats()) == 1100
    finally:
        feed.stop()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_replay_socket_that_cannot_be_opened_counts_as_unanswered() -> None:
    # Out of descriptors (here: of the context's sockets) the replay request used to
    # raise "Too many open files" out of the feed thread, which then stopped for good.
    ctx = zmq.Context()
    ctx.set(zmq.MAX_SOCKETS, 1)  # room for the SUB socket only
    slots = ReplaySlots(4)
    sub = EventSubscriber(
        "tcp://127.0.0.1:9", "tcp://127.0.0.1:10", replay_slots=slots, context=ctx
    )
    try:
        assert sub.begin_tail() == []
        assert sub.replay_in_flight and not sub.replay_waiting and sub.replay_socket is None
        assert sub.advance() == []
        assert sub.num_replay_timeouts == 1 and sub.replay_unanswered == 1
        assert not sub.replay_in_flight and slots.free == 4
    finally:
        sub.close()
        ctx.term()
