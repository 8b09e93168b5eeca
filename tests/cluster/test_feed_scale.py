"""The feed at fleet scale: file descriptors checked up front, more than 1,023 engines."""

from __future__ import annotations

import pytest

pytest.importorskip("zmq")
resource = pytest.importorskip("resource")

from pagedkv.cluster import KVIndex  # noqa: E402
from pagedkv.cluster.feed import EngineEndpoints, IndexFeed, reserve_descriptors  # noqa: E402
from pagedkv.errors import ConfigError  # noqa: E402

pytestmark = pytest.mark.timeout(120)


def test_too_few_descriptors_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(resource, "getrlimit", lambda _: (1024, 1024))

    def refuse(*_: object) -> None:
        raise ValueError("not allowed")

    monkeypatch.setattr(resource, "setrlimit", refuse)
    reserve_descriptors(400)  # fits
    with pytest.raises(ConfigError, match=r"1000 engines need about 2064 open files"):
        reserve_descriptors(1000)


def test_more_than_1023_engines_start() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 2 * 1100 + 64:
        pytest.skip(f"hard open-file limit {hard}")
    engines = {f"e{i}": EngineEndpoints(f"tcp://127.0.0.1:{20000 + i}") for i in range(1100)}
    feed = IndexFeed(KVIndex(), engines, idle_sync_s=3600.0)
    try:
        feed.start(timeout_s=60)
        assert feed.alive and len(feed.stats()) == 1100
    finally:
        feed.stop()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
