"""The route service over real publishers on loopback, queried through Starlette's client."""

from __future__ import annotations

import sys
import time

import pytest

pytest.importorskip("zmq")
pytest.importorskip("starlette")
pytest.importorskip("prometheus_client")
pytest.importorskip("httpx")

from starlette.testclient import TestClient

from events.helpers import LOOPBACK, small_manager
from pagedkv import Request
from pagedkv.cli.route import parse_engines, parse_listen
from pagedkv.cluster import KVIndex, PromptHasher, make_router
from pagedkv.cluster.feed import EngineEndpoints, IndexFeed
from pagedkv.cluster.service import RouteService, create_app
from pagedkv.errors import ConfigError
from pagedkv.events import KVEventsConfig, ZmqEventPublisher
from pagedkv.events.wire import encode_event_batch, external_block_hash

pytestmark = pytest.mark.timeout(60)
PROMPT = list(range(100, 140))  # 10 full blocks of 4


def _cache(manager, tokens):  # type: ignore[no-untyped-def]
    req = Request("r", tokens)
    manager.allocate_slots(req, len(tokens))
    req.num_computed_tokens = len(tokens)
    manager.free(req)
    return req


@pytest.mark.slow
def test_route_healthz_metrics_on_live_engines() -> None:
    config = KVEventsConfig(endpoint=LOOPBACK, replay_endpoint=LOOPBACK)
    with ZmqEventPublisher(config) as pub_a, ZmqEventPublisher(config) as pub_b:
        ends = {
            "a": EngineEndpoints(pub_a.endpoint, pub_a.replay_endpoint),
            "b": EngineEndpoints(pub_b.endpoint, pub_b.replay_endpoint),
        }
        index = KVIndex()
        with IndexFeed(index, ends) as feed:
            manager_a, manager_b = small_manager(), small_manager()
            req = _cache(manager_a, PROMPT)
            pub_a.publish(manager_a.take_events())
            _cache(manager_b, PROMPT[:8])
            pub_b.publish(manager_b.take_events())
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and any(s.batches < 1 for s in feed.stats().values()):
                time.sleep(0.02)
            service = RouteService(index, make_router("prefix"), PromptHasher(4), ["a", "b"], feed)
            client = TestClient(create_app(service))

            answer = client.post("/route", json={"token_ids": [*PROMPT, 1, 2, 3]}).json()
            assert answer["engine"] == "a" and answer["num_prompt_blocks"] == 10
            assert answer["num_cached_blocks"] == 10
            # which blocks other engines (other tenants) hold is the operator's business only
            assert "cached_blocks" not in answer
            assert service.route({"token_ids": [*PROMPT, 1]}, explain=True)["cached_blocks"] == {
                "a": 10, "b": 2,
            }  # fmt: skip
            hashes = [external_block_hash(h) for h in req.block_hashes[:3]]
            assert client.post("/route", json={"block_hashes": hashes}).json()["engine"] == "a"
            salted = client.post("/route", json={"token_ids": PROMPT, "cache_salt": "t"}).json()
            assert salted["num_cached_blocks"] == 0

            ok = client.post("/engines/b/load", json={"running": 3, "kv_usage": 0.5})
            assert ok.status_code == 200 and ok.json()["running"] == 3
            assert client.post("/engines/zz/load", json={}).status_code == 404
            bad = client.post("/route", json={"token_ids": "abc"})
            assert bad.status_code == 400 and "token_ids" in bad.json()["error"]["message"]
            assert client.post("/route", content=b"{").status_code == 400

            health = client.get("/healthz").json()
            assert health["status"] == "ok" and health["engines"]["a"]["batches"] == 1
            text = client.get("/metrics").text
            assert 'pagedkv_route_requests_total{engine="a"} ' in text
            assert 'pagedkv_feed_batches_total{engine="b"} 1.0' in text
            assert "pagedkv_route_seconds_bucket" in text


def test_engine_and_listen_flags_are_parsed_and_checked() -> None:
    specs = parse_engines("tcp://h:5557,gpu1=tcp://h:5567", "tcp://h:5558,tcp://h:5568")
    assert [(s.name, s.endpoint, s.replay_endpoint) for s in specs] == [
        ("tcp://h:5557", "tcp://h:5557", "tcp://h:5558"),
        ("gpu1", "tcp://h:5567", "tcp://h:5568"),
    ]
    assert parse_listen("0.0.0.0:8080") == ("0.0.0.0", 8080)
    with pytest.raises(ConfigError, match="--replay-endpoints"):
        parse_engines("tcp://h:1,tcp://h:2", "tcp://h:3")
    with pytest.raises(ConfigError, match="not a ZeroMQ address"):
        parse_engines("h:1", None)
    with pytest.raises(ConfigError, match="same name"):
        parse_engines("x=tcp://h:1,x=tcp://h:2", None)
    with pytest.raises(ConfigError, match="HOST:PORT"):
        parse_listen("8080")


@pytest.mark.slow
def test_route_serve_command_serves_over_http() -> None:
    import os
    import socket
    import subprocess
    import sys

    import httpx

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = KVEventsConfig(endpoint=LOOPBACK, replay_endpoint=LOOPBACK)
    with ZmqEventPublisher(config) as pub:
        manager = small_manager()
        _cache(manager, PROMPT)
        pub.publish(manager.take_events())
        args = [
            sys.executable, "-m", "pagedkv.cli", "route", "serve",
            "--engines", f"gpu0={pub.endpoint}", "--replay-endpoints", str(pub.replay_endpoint),
            "--listen", f"127.0.0.1:{port}", "--block-size", "4", "--router", "prefix",
        ]  # fmt: skip
        proc = subprocess.Popen(args, stderr=subprocess.PIPE, text=True, env=dict(os.environ))
        try:
            url = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 30
            health = None
            while time.monotonic() < deadline:
                try:
                    health = httpx.get(f"{url}/healthz", timeout=1).json()
                    if health["engines"].get("gpu0", {}).get("batches"):
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.1)
            assert health is not None and health["engines"]["gpu0"]["batches"] == 1
            answer = httpx.post(f"{url}/route", json={"token_ids": PROMPT}, timeout=5).json()
            assert answer == {
                "engine": "gpu0", "router": "prefix", "num_prompt_blocks": 10,
                "num_cached_blocks": 10,
            }  # fmt: skip
        finally:
            proc.terminate()
            proc.wait(10)


def test_a_dead_feed_turns_healthz_503_and_a_bad_endpoint_is_named() -> None:
    config = KVEventsConfig(endpoint=LOOPBACK, replay_endpoint=LOOPBACK)
    with ZmqEventPublisher(config) as pub:
        index = KVIndex()

        def broken(*args: object, **kwargs: object) -> None:
            raise RuntimeError("index bug")

        index.apply_batch = broken  # type: ignore[method-assign]
        feed = IndexFeed(index, {"a": EngineEndpoints(pub.endpoint, pub.replay_endpoint)})
        with feed:
            client = TestClient(create_app(RouteService(index, make_router("prefix"),
                                                        PromptHasher(4), ["a"], feed)))  # fmt: skip
            assert client.get("/healthz").status_code == 200
            manager = small_manager()
            _cache(manager, PROMPT)
            pub.publish(manager.take_events())
            deadline = time.monotonic() + 10
            while feed.alive and time.monotonic() < deadline:
                time.sleep(0.02)
            answer = client.get("/healthz")
            assert answer.status_code == 503 and "index bug" in answer.json()["error"]
    with pytest.raises(ConfigError, match=r"engine .x. at tcp://"):
        IndexFeed(KVIndex(), {"x": EngineEndpoints("tcp://*:notaport")}).start()


def test_an_engine_whose_replay_goes_unanswered_is_stale_in_healthz() -> None:
    # Its first batch shows a gap and its replay endpoint takes requests, never answers.
    import zmq

    ctx = zmq.Context()
    pub, silent = ctx.socket(zmq.PUB), ctx.socket(zmq.ROUTER)
    try:
        pub.bind(LOOPBACK)
        silent.bind(LOOPBACK)
        ends = EngineEndpoints(
            pub.getsockopt_string(zmq.LAST_ENDPOINT), silent.getsockopt_string(zmq.LAST_ENDPOINT)
        )
        index = KVIndex()
        feed = IndexFeed(index, {"a": ends}, idle_sync_s=3600.0, replay_timeout_s=0.05)
        with feed:
            service = RouteService(index, make_router("prefix"), PromptHasher(4), ["a"], feed)
            client = TestClient(create_app(service))
            assert client.get("/healthz").json()["engines"]["a"]["state"] == "up"
            manager = small_manager()
            _cache(manager, PROMPT)
            gap_batch = encode_event_batch(manager.take_events(), 5)
            deadline = time.monotonic() + 20
            while not feed.stats()["a"].replay_unanswered and time.monotonic() < deadline:
                pub.send_multipart(gap_batch)
                time.sleep(0.02)
            answer = client.get("/healthz")
            assert answer.status_code == 200 and answer.json()["status"] == "degraded"
            engine = answer.json()["engines"]["a"]
            assert engine["state"] == "stale" and engine["healthy"] is True
            assert engine["replay_unanswered"] >= 1
    finally:
        pub.close(linger=0)
        silent.close(linger=0)
        ctx.term()


def test_route_serve_refuses_the_per_process_builtin_hash(monkeypatch: pytest.MonkeyPatch) -> None:
    import types

    from pagedkv.cli.app import main

    def run(*args: object, **kwargs: object) -> None:
        raise AssertionError("the command started serving")

    monkeypatch.setitem(sys.modules, "uvicorn", types.SimpleNamespace(run=run))
    args = ["route", "serve", "--engines", "tcp://127.0.0.1:1", "--hash-algo", "builtin"]
    assert main(args) == 2


def test_route_hashes_a_lora_prompt_with_its_path() -> None:
    # vLLM's block hash keys a LoRA by name and path: a route query that drops the path
    # would match nothing the engine cached for that adapter.
    from pagedkv.runtime.hashing import LoRA

    manager = small_manager()
    req = Request("r", PROMPT, lora=LoRA("adapter", 1, "/adapters/a"))
    manager.allocate_slots(req, len(PROMPT))
    req.num_computed_tokens = len(PROMPT)
    manager.free(req)
    index = KVIndex()
    index.apply("a", manager.take_events(), external_block_hash)
    index.add_engine("b")
    service = RouteService(index, make_router("prefix"), PromptHasher(4), ["a", "b"])
    body = {"token_ids": PROMPT, "lora_name": "adapter", "lora_path": "/adapters/a"}
    assert service.route(body, explain=True)["cached_blocks"] == {"a": 10, "b": 0}
    assert service.route({**body, "lora_path": "/other"}, explain=True)["cached_blocks"]["a"] == 0
    with pytest.raises(ValueError, match="lora_path"):
        service.route({**body, "lora_path": 3})
