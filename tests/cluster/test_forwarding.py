"""The router forwarding OpenAI requests to fake engines (no ZeroMQ, no model): choice,
streams, engines refusing or failing mid-answer, scraped loads, health, keys, limits."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

pytest.importorskip("starlette")
pytest.importorskip("httpx")
pytest.importorskip("prometheus_client")

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from pagedkv.cluster import KVIndex, PromptHasher, make_router
from pagedkv.cluster.engines import checked_load, parse_vllm_metrics
from pagedkv.cluster.service import RouterSettings, RouteService, create_app

pytestmark = pytest.mark.timeout(60)


class ListTokenizer:
    """Prompts are lists of token ids already; chats are their contents' lengths."""

    def prompt_ids(self, body: dict[str, Any], chat: bool) -> list[int]:
        if chat:
            return [len(m["content"]) for m in body["messages"]]
        prompt = body.get("prompt")
        if not isinstance(prompt, list):
            raise ValueError("prompt must be a list of ids here")
        return prompt


def fake_engine(name: str, running: float = 0.0) -> Starlette:
    state = {"running": running, "requests": 0}

    async def completions(request: Request) -> Response:
        body = await request.json()
        state["requests"] += 1
        if body.get("stream"):

            async def events() -> AsyncIterator[bytes]:
                for piece in (name, "!"):
                    yield f"data: {json.dumps({'choices': [{'text': piece}]})}\n\n".encode()
                yield b"data: [DONE]\n\n"

            return StreamingResponse(events(), media_type="text/event-stream")
        return JSONResponse({"engine": name, "prompt": body.get("prompt")})

    async def metrics(request: Request) -> Response:
        text = (
            "# TYPE vllm:num_requests_running gauge\n"
            f'vllm:num_requests_running{{engine="0",model_name="m"}} {state["running"]}\n'
            "# TYPE vllm:num_requests_waiting gauge\n"
            'vllm:num_requests_waiting{engine="0",model_name="m"} 1.0\n'
            "# TYPE vllm:kv_cache_usage_perc gauge\n"
            'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25\n'
        )
        return Response(text, media_type="text/plain")

    app = Starlette(
        routes=[
            Route("/v1/completions", completions, methods=["POST"]),
            Route("/v1/chat/completions", completions, methods=["POST"]),
            Route("/metrics", metrics),
        ]
    )
    app.state.counts = state
    return app


class BrokenStream(httpx.AsyncByteStream):
    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield b'data: {"choices": [{"text": "partial"}]}\n\n'
        raise httpx.ReadError("engine died")


class Fleet(httpx.AsyncBaseTransport):
    """Hosts to fake engines; ``down`` hosts refuse connections, ``broken`` ones fail
    after the answer began."""

    def __init__(self, apps: dict[str, Starlette]) -> None:
        self.apps = {h: httpx.ASGITransport(app=a) for h, a in apps.items()}
        self.down: set[str] = set()
        self.broken: set[str] = set()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        host = request.url.host
        if host in self.down:
            raise httpx.ConnectError("connection refused", request=request)
        if host in self.broken and request.url.path.startswith("/v1"):
            headers = {"content-type": "text/event-stream"}
            return httpx.Response(200, headers=headers, stream=BrokenStream())
        return await self.apps[host].handle_async_request(request)


def make_router_app(
    names: list[str], router: str = "round-robin", **settings: Any
) -> tuple[RouteService, Fleet, Starlette]:
    apps = {n: fake_engine(n) for n in names}
    fleet = Fleet(apps)
    urls = {n: f"http://{n}" for n in names}
    options = {"scrape_interval_s": 3600.0, "unhealthy_after": 1} | settings
    service = RouteService(
        KVIndex(), make_router(router), PromptHasher(4), urls,
        tokenizer=ListTokenizer(), settings=RouterSettings(**options),
    )  # fmt: skip
    return service, fleet, create_app(service, transport=fleet)


def test_requests_are_forwarded_in_turn_and_streams_relayed() -> None:
    service, _fleet, app = make_router_app(["e0", "e1"])
    with TestClient(app) as client:
        answers = [
            client.post("/v1/completions", json={"prompt": [1, 2, 3, 4, 5]}).json()["engine"]
            for _ in range(4)
        ]
        assert sorted(answers) == ["e0", "e0", "e1", "e1"]
        stream = client.post("/v1/completions", json={"prompt": [1], "stream": True})
        assert stream.status_code == 200 and stream.text.endswith("data: [DONE]\n\n")
        chat = client.post(
            "/v1/chat/completions", json={"messages": [{"role": "u", "content": "x"}]}
        )
        assert chat.status_code == 200
    assert all(s.in_flight == 0 for s in service.table.values())


def test_a_refusing_engine_is_taken_out_and_its_request_goes_elsewhere() -> None:
    service, fleet, app = make_router_app(["e0", "e1"])
    fleet.down.add("e0")
    with TestClient(app) as client:
        engines = {
            client.post("/v1/completions", json={"prompt": [7, 8]}).json()["engine"]
            for _ in range(4)
        }
        assert engines == {"e1"}
        assert not service.table["e0"].healthy
        assert client.get("/healthz").json()["engines"]["e0"]["healthy"] is False
        fleet.down.add("e1")
        last = client.post("/v1/completions", json={"prompt": [7, 8]})
        assert last.status_code == 503 and client.get("/healthz").status_code == 503
        assert 'pagedkv_engine_up{engine="e1"} 0.0' in client.get("/metrics").text


def test_healthz_is_degraded_while_an_engine_is_down() -> None:
    service, fleet, app = make_router_app(["e0", "e1"])
    with TestClient(app) as client:
        answer = client.get("/healthz")
        assert answer.status_code == 200 and answer.json()["status"] == "ok"
        fleet.down.add("e0")
        client.portal.call(service.scrape, httpx.AsyncClient(transport=fleet))  # type: ignore[union-attr]
        answer = client.get("/healthz")
        assert answer.status_code == 200 and answer.json()["status"] == "degraded"
        states = {name: e["state"] for name, e in answer.json()["engines"].items()}
        assert states == {"e0": "down", "e1": "up"}
        fleet.down.add("e1")
        client.portal.call(service.scrape, httpx.AsyncClient(transport=fleet))  # type: ignore[union-attr]
        answer = client.get("/healthz")
        assert answer.status_code == 503 and answer.json()["status"] == "no engine up"
        fleet.down.clear()
        client.portal.call(service.scrape, httpx.AsyncClient(transport=fleet))  # type: ignore[union-attr]
        assert client.get("/healthz").json()["status"] == "ok"


def test_failures_mid_answer_reach_the_client() -> None:
    service, fleet, app = make_router_app(["e0"])
    fleet.broken.add("e0")
    with TestClient(app) as client:
        whole = client.post("/v1/completions", json={"prompt": [1]})
        assert whole.status_code == 502 and "e0" in whole.json()["error"]["message"]
        stream = client.post("/v1/completions", json={"prompt": [1], "stream": True})
        assert stream.status_code == 200
        assert "partial" in stream.text and "failed mid-stream" in stream.text
        assert stream.text.endswith("data: [DONE]\n\n")
    assert service.table["e0"].in_flight == 0


def test_silent_engines_time_out() -> None:
    import anyio

    async def slow(request: Request) -> Response:
        await anyio.sleep(30)
        return JSONResponse({})

    apps = {"e0": Starlette(routes=[Route("/v1/completions", slow, methods=["POST"])])}
    service = RouteService(
        KVIndex(), make_router("round-robin"), PromptHasher(4), {"e0": "http://e0"},
        tokenizer=ListTokenizer(),
        settings=RouterSettings(request_timeout_s=0.2, scrape_interval_s=3600.0),
    )  # fmt: skip
    with TestClient(create_app(service, transport=Fleet(apps))) as client:
        answer = client.post("/v1/completions", json={"prompt": [1]})
    assert answer.status_code in (502, 504)


def test_scraped_metrics_become_loads_and_health() -> None:
    service, fleet, app = make_router_app(["e0", "e1"], router="least-loaded")
    fleet.apps["e0"].app.state.counts["running"] = 5.0  # type: ignore[attr-defined]
    with TestClient(app) as client:
        client.portal.call(service.scrape, httpx.AsyncClient(transport=fleet))  # type: ignore[union-attr]
        assert service.table["e0"].reported.running == 5
        assert service.table["e1"].reported.kv_usage == 0.25
        for _ in range(3):
            assert client.post("/v1/completions", json={"prompt": [1]}).json()["engine"] == "e1"
        fleet.down.add("e1")
        client.portal.call(service.scrape, httpx.AsyncClient(transport=fleet))  # type: ignore[union-attr]
        assert not service.table["e1"].healthy
        fleet.down.clear()
        client.portal.call(service.scrape, httpx.AsyncClient(transport=fleet))  # type: ignore[union-attr]
        assert service.table["e1"].healthy


def test_metrics_parsing_refuses_nonsense() -> None:
    good = (
        "vllm:num_requests_running 2\nvllm:num_requests_waiting 3\nvllm:kv_cache_usage_perc 0.5\n"
    )
    assert parse_vllm_metrics(good).load.requests == 5
    for bad in ("vllm:num_requests_running NaN\n", "vllm:num_requests_waiting -1\n", "up 1\n"):
        with pytest.raises(ValueError):
            parse_vllm_metrics(bad)
    for values in (
        (float("nan"), 0, 0.0),
        (1, float("inf"), 0.0),
        (-1, 0, 0.0),
        (1, 0, 1.5),
        (1.5, 0, 0),
    ):
        with pytest.raises(ValueError):
            checked_load(*values)


@pytest.mark.parametrize(
    "body",
    [
        {"running": float("nan")},
        {"running": -2},
        {"waiting": 1e309},
        {"kv_usage": float("inf")},
        {"kv_usage": "x"},
    ],
)
def test_posted_loads_are_checked(body: dict[str, Any]) -> None:
    _service, _, app = make_router_app(["e0"], router="cost", load_source="post")
    client = TestClient(app)
    raw = json.dumps(body).encode()  # NaN/Infinity literals are refused too
    answer = client.post("/engines/e0/load", content=raw)
    assert answer.status_code == 400
    assert client.post("/route", json={"token_ids": [1, 2, 3, 4]}).status_code == 200


def test_deeply_nested_json_is_a_400() -> None:
    _, _, app = make_router_app(["e0"], max_body_bytes=1 << 20)
    deep = b"[" * 100_000 + b"]" * 100_000
    with TestClient(app) as client:
        for path in ("/route", "/engines/e0/load", "/v1/completions"):
            assert client.post(path, content=deep).status_code == 400


def test_keys_guard_every_endpoint_and_admin_sees_per_engine_blocks() -> None:
    _, _, app = make_router_app(
        ["e0", "e1"], api_keys=("client",), admin_api_keys=("operator",), max_body_bytes=1000
    )
    with TestClient(app) as client:
        for path in ("/healthz", "/metrics"):
            assert client.get(path).status_code == 401
        body = {"token_ids": [1, 2, 3, 4]}
        assert client.post("/route", json=body).status_code == 401
        user = {"Authorization": "Bearer client"}
        answer = client.post("/route", json=body, headers=user).json()
        assert "cached_blocks" not in answer
        assert client.post("/admin/route", json=body, headers=user).status_code == 401
        admin = client.post("/admin/route", json=body, headers={"Authorization": "Bearer operator"})
        assert admin.json()["cached_blocks"] == {"e0": 0, "e1": 0}
        big = client.post("/v1/completions", json={"prompt": [1] * 1000}, headers=user)
        assert big.status_code == 413


def test_a_connection_reset_before_any_answer_is_retried_elsewhere() -> None:
    # a killed engine resets the kept-alive connection: nothing was answered, so the
    # request goes to another engine instead of failing
    service, _fleet, app = make_router_app(["e0", "e1"])

    class Resetting(Fleet):
        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            if request.url.host == "e0":
                raise httpx.ReadError("connection reset", request=request)
            return await super().handle_async_request(request)

    resetting = Resetting({n: fake_engine(n) for n in ("e0", "e1")})
    app = create_app(service, transport=resetting)
    with TestClient(app) as client:
        engines = {
            client.post("/v1/completions", json={"prompt": [1]}).json()["engine"] for _ in range(3)
        }
    assert engines == {"e1"} and not service.table["e0"].healthy
