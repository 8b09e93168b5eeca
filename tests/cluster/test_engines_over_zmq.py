"""Several engine processes publish over real ZeroMQ; one KVIndex follows them exactly."""

from __future__ import annotations

import multiprocessing as mp
import time
from typing import Any

import pytest

pytest.importorskip("zmq")

from pagedkv.cluster import KVIndex
from pagedkv.cluster.feed import EngineEndpoints, IndexFeed

pytestmark = pytest.mark.timeout(90)
NUM_ENGINES = 3


def _engine_process(
    name: str, seed: int, hwm: int, endpoints: Any, results: Any, go: Any, done: Any
) -> None:
    from pagedkv.config import EngineConfig
    from pagedkv.events import KVEventsConfig
    from pagedkv.planning.types import KVCacheConfig, KVCacheGroupSpec
    from pagedkv.sim.fleet.publish import publish_replay
    from pagedkv.sim.scheduling.scheduler import SchedulerSettings
    from pagedkv.sim.setup import SimSetup
    from pagedkv.sim.traces.synthetic import SyntheticTraceConfig, synthetic_trace
    from pagedkv.specs import FullAttentionSpec

    spec = FullAttentionSpec(block_size=4, num_kv_heads=1, head_size=8)
    group = KVCacheGroupSpec(layer_names=("full.0",), kv_cache_spec=spec)
    kv = KVCacheConfig(
        num_blocks=120, kv_cache_tensors=(), kv_cache_groups=(group,), max_model_len=512
    )
    setup = SimSetup(
        kv_cache_config=kv, config=EngineConfig.create(block_size=4, max_model_len=512)
    )
    trace = synthetic_trace(
        SyntheticTraceConfig(
            num_requests=60, seed=seed, num_system_prompts=4, system_prompt_tokens=(24, 80),
            user_tokens=(4, 40), output_tokens=(2, 12), max_prompt_tokens=480,
        )
    )  # fmt: skip
    local = "tcp://127.0.0.1:*"
    config = KVEventsConfig(endpoint=local, replay_endpoint=local, hwm=hwm)
    settings = SchedulerSettings(max_num_seqs=8, max_num_batched_tokens=256)

    def started(pub: Any) -> None:
        endpoints.put((name, pub.endpoint, pub.replay_endpoint))
        go.wait(30)  # the parent has subscribed

    def finished(run: Any) -> None:
        results.put((name, sorted(run.cached_hashes), run.num_batches, run.result.evictions))
        done.wait(60)  # the parent has replayed what it missed

    publish_replay(setup, trace, config, settings, on_started=started, before_close=finished)


def _run_fleet(drop_every: int, hwm: int) -> tuple[KVIndex, IndexFeed, dict[str, Any]]:
    ctx = mp.get_context("spawn")
    endpoints, results, go, done = ctx.Queue(), ctx.Queue(), ctx.Event(), ctx.Event()
    procs = [
        ctx.Process(target=_engine_process, args=(f"e{i}", i, hwm, endpoints, results, go, done))
        for i in range(NUM_ENGINES)
    ]
    for p in procs:
        p.start()
    try:
        ends = {}
        for _ in procs:
            name, pub, replay = endpoints.get(timeout=30)
            ends[name] = EngineEndpoints(pub, replay)
        index = KVIndex()
        feed = IndexFeed(index, ends, drop_every=drop_every, idle_sync_s=0.3).start()
        time.sleep(0.3)  # let the SUB sockets connect
        go.set()
        out = {}
        for _ in procs:
            name, cached, num_batches, evictions = results.get(timeout=60)
            out[name] = (set(cached), num_batches, evictions)
        assert feed.sync(timeout_s=20)
        feed.stop()
        return index, feed, out
    finally:
        go.set()
        done.set()
        for p in procs:
            p.join(20)
            if p.is_alive():
                p.kill()
        deadline = time.monotonic() + 5
        while any(p.is_alive() for p in procs) and time.monotonic() < deadline:
            time.sleep(0.05)


@pytest.mark.slow
@pytest.mark.parametrize(("drop_every", "hwm"), [(0, 100_000), (3, 2)])
def test_index_equals_the_union_of_engine_caches(drop_every: int, hwm: int) -> None:
    index, feed, out = _run_fleet(drop_every, hwm)
    stats = feed.stats()
    for name, (cached, num_batches, evictions) in out.items():
        assert cached and evictions > 0  # the caches filled and evicted: BlockRemoved flowed
        assert index.engine_hashes(name).get(("GPU", 0), set()) == cached, name
        assert stats[name].next_seq == num_batches and stats[name].lost == 0
        if drop_every:  # what the feed missed live came back by replay
            assert stats[name].replayed > 0
    held_anywhere = set().union(*(cached for cached, _, _ in out.values()))
    assert {h for h in held_anywhere if index.holders(h)} == held_anywhere
