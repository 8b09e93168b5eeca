"""The router: a Starlette app that forwards OpenAI requests to the engine that serves
them best, from a KVIndex kept current by an IndexFeed (``route`` extra: starlette,
uvicorn, prometheus-client, httpx).

    POST /v1/completions, /v1/chat/completions   forwarded (streams too) to the chosen
                                engine; the prompt is tokenized with the model's tokenizer
                                and chat template to find its cached blocks
    POST /route                 {"token_ids": [...]} or {"block_hashes": [...]} ->
                                {"engine", "num_prompt_blocks", "num_cached_blocks"}
    POST /engines/{name}/load   {"running", "waiting", "kv_usage"} (with --load-source post)
    GET  /healthz               status ok | degraded (200), no engine up | feed stopped
                                (503), and each engine's state: up | down | stale
    GET  /metrics
    POST /admin/route           as /route plus every engine's cached blocks (admin key)

Tokenizing and hashing run in worker threads, never on the event loop. Engines' loads
come from scraping their ``/metrics`` every ``scrape_interval_s``; a failed scrape or a
refused connection takes an engine out (and its blocks out of the index) until a scrape
succeeds again. A request whose engine refuses the connection is sent to the next best
engine; an engine that fails after answering began is reported to the client (an error
status, or an error event in a stream), and every wait is bounded by a timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import httpx
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from pagedkv.cluster.engines import (
    EngineState,
    checked_load,
    engine_table,
    parse_vllm_metrics,
)
from pagedkv.cluster.feed import EngineFeedStats, IndexFeed
from pagedkv.cluster.hashing import PromptHasher
from pagedkv.cluster.http import (
    DEFAULT_MAX_BODY_BYTES,
    ApiKeyMiddleware,
    HTTPError,
    error_response,
    parse_json_object,
    read_body,
)
from pagedkv.cluster.index import KVIndex
from pagedkv.cluster.routing import Router
from pagedkv.errors import PagedKVError
from pagedkv.runtime.events import ExternalBlockHash

__all__ = [
    "Choice",
    "PromptTokenizer",
    "RouteService",
    "RouterSettings",
    "create_app",
    "engine_health",
]

MAX_PROMPT_TOKENS = 1 << 21
LOAD_SOURCES = ("metrics", "post")
UP, DOWN, STALE = "up", "down", "stale"  # an engine's state in /healthz
HEALTHY_STATUSES = ("ok", "degraded")  # /healthz answers 200; otherwise 503


def engine_health(healthy: bool, feed: EngineFeedStats | None) -> str:
    """``down``: out of routing (its scrapes fail or it refused a connection);
    ``stale``: in routing, but its replay endpoint left the last request unanswered, so
    a lost batch cannot be repaired and its cached blocks may be behind; else ``up``."""
    if not healthy:
        return DOWN
    if feed is not None and feed.replay_unanswered:
        return STALE
    return UP


class PromptTokenizer(Protocol):
    """The model's tokenizer as the engines apply it (``pagedkv.hf.tokenizer.ChatTokenizer``)."""

    def prompt_ids(self, body: dict[str, Any], chat: bool) -> list[int]: ...


@dataclass(frozen=True)
class RouterSettings:
    """Timeouts, intervals and limits of the router (seconds, bytes)."""

    connect_timeout_s: float = 2.0
    request_timeout_s: float = 300.0  # the longest an engine may stay silent mid-request
    scrape_interval_s: float = 1.0
    scrape_timeout_s: float = 2.0
    unhealthy_after: int = 2  # failed scrapes in a row
    load_source: str = "metrics"
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    api_keys: tuple[str, ...] = ()
    admin_api_keys: tuple[str, ...] = ()
    engine_api_key: str | None = None  # sent to the engines

    def __post_init__(self) -> None:
        if self.load_source not in LOAD_SOURCES:
            raise ValueError(f"load_source must be one of {LOAD_SOURCES}, got {self.load_source!r}")


@dataclass(frozen=True)
class Choice:
    """The engine chosen for a prompt, and the cached blocks that decided it."""

    engine: str
    num_prompt_blocks: int
    num_cached_blocks: int
    cached_by_engine: Mapping[str, int]


class RouteService:
    """Engines, index, router, hasher and tokenizer behind the HTTP API.

    Args:
        index: the KV index of which engine holds which blocks.
        router: the routing policy choosing an engine.
        hasher: hashes a prompt's blocks as the engines do.
        engines: engine names, or name -> the URL requests are forwarded to (None: route only).
        feed: the event feed keeping ``index`` current (None: the index is fed elsewhere).
        tokenizer: turns prompt text into tokens (None: requests must bring token ids).
        settings: the router's timeouts, intervals and limits (None: the defaults).
    """

    def __init__(
        self,
        index: KVIndex,
        router: Router,
        hasher: PromptHasher,
        engines: Mapping[str, str | None] | Iterable[str],
        feed: IndexFeed | None = None,
        *,
        tokenizer: PromptTokenizer | None = None,
        settings: RouterSettings | None = None,
    ) -> None:
        self.index = index
        self.router = router
        self.hasher = hasher
        self.table = engine_table(engines)
        self.engines = list(self.table)
        self.feed = feed
        self.tokenizer = tokenizer
        self.settings = settings or RouterSettings()
        self.registry = CollectorRegistry()
        self.routed = Counter(
            "pagedkv_route_requests", "Requests routed, by engine", ["engine"],
            registry=self.registry,
        )  # fmt: skip
        self.cached = Counter(
            "pagedkv_route_cached_blocks", "Cached prompt blocks on the chosen engine",
            registry=self.registry,
        )  # fmt: skip
        self.prompt = Counter(
            "pagedkv_route_prompt_blocks", "Prompt blocks routed", registry=self.registry
        )
        self.forward_errors = Counter(
            "pagedkv_route_forward_errors", "Forwarded requests that failed, by engine and kind",
            ["engine", "kind"], registry=self.registry,
        )  # fmt: skip
        self.latency = Histogram(
            "pagedkv_route_seconds", "Time to choose an engine", registry=self.registry,
            buckets=(1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3, 1.0),
        )  # fmt: skip
        self.registry.register(_StateCollector(self))

    # -- routing --------------------------------------------------------------------
    @property
    def loads(self) -> dict[str, Any]:
        return {name: state.load() for name, state in self.table.items()}

    def healthy_engines(self, exclude: Iterable[str] = ()) -> list[str]:
        skip = set(exclude)
        return [n for n, s in self.table.items() if s.healthy and n not in skip]

    def choose(
        self, hashes: Sequence[ExternalBlockHash], exclude: Iterable[str] = ()
    ) -> Choice | None:
        """The engine for a prompt with these block hashes (None: no engine is up)."""
        t0 = time.perf_counter()
        names = self.healthy_engines(exclude)
        if not names:
            return None
        by_name: dict[str, int] = {}
        if self.router.uses_cache and hashes:
            lock = self.feed.lock if self.feed is not None else contextlib.nullcontext()
            with lock:
                counts = self.index.prefix_blocks(hashes)
                by_name = dict(zip(self.index.engines, counts))
        cached = [by_name.get(n, 0) for n in names]
        loads = [self.table[n].load() for n in names]
        engine = names[self.router.choose(cached, loads, len(hashes))]
        self.routed.labels(engine).inc()
        self.cached.inc(by_name.get(engine, 0))
        self.prompt.inc(len(hashes))
        self.latency.observe(time.perf_counter() - t0)
        return Choice(engine, len(hashes), by_name.get(engine, 0), dict(zip(names, cached)))

    def route(self, body: dict[str, Any], explain: bool = False) -> dict[str, Any]:
        choice = self.choose(self._hashes(body))
        if choice is None:
            raise HTTPError(503, "no engine is up", "service_unavailable")
        answer: dict[str, Any] = {
            "engine": choice.engine,
            "router": self.router.name,
            "num_prompt_blocks": choice.num_prompt_blocks,
            "num_cached_blocks": choice.num_cached_blocks,
        }
        if explain:
            answer["cached_blocks"] = dict(choice.cached_by_engine)
            answer["loads"] = {n: s.load()._asdict() for n, s in self.table.items()}
        return answer

    def _hashes(self, body: dict[str, Any]) -> list[ExternalBlockHash]:
        if "block_hashes" in body:
            hashes = body["block_hashes"]
            if not isinstance(hashes, list) or not all(
                isinstance(h, int) and not isinstance(h, bool) for h in hashes
            ):
                raise ValueError("block_hashes must be a list of integers")
            return hashes
        tokens = body.get("token_ids")
        if not isinstance(tokens, list) or not tokens or len(tokens) > MAX_PROMPT_TOKENS:
            raise ValueError("give token_ids (a non-empty list of integers) or block_hashes")
        return self.hash_tokens(tokens, body)

    def hash_tokens(
        self, tokens: Sequence[Any], body: Mapping[str, Any]
    ) -> list[ExternalBlockHash]:
        if not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
            raise ValueError("token_ids must be integers")
        for key in ("lora_name", "lora_path", "cache_salt"):
            if body.get(key) is not None and not isinstance(body[key], str):
                raise ValueError(f"{key} must be a string")
        return self.hasher(
            tokens,
            lora_name=body.get("lora_name"),
            lora_path=body.get("lora_path") or "",
            cache_salt=body.get("cache_salt"),
        )

    def openai_hashes(self, body: dict[str, Any], chat: bool) -> list[ExternalBlockHash]:
        """Block hashes of an OpenAI request's prompt (tokenized as the engines do)."""
        if self.tokenizer is None:
            return []
        tokens = self.tokenizer.prompt_ids(body, chat)
        if len(tokens) > MAX_PROMPT_TOKENS:
            raise ValueError(f"the prompt is over {MAX_PROMPT_TOKENS} tokens")
        return self.hash_tokens(tokens, {"cache_salt": body.get("cache_salt")})

    # -- engine state ---------------------------------------------------------------
    def set_load(self, engine: str, body: dict[str, Any]) -> None:
        if engine not in self.table:
            raise KeyError(engine)
        self.table[engine].reported = checked_load(
            body.get("running", 0), body.get("waiting", 0), body.get("kv_usage", 0.0)
        )

    def mark_down(self, engine: str) -> None:
        """Out of routing and out of the index, until it answers again."""
        state = self.table[engine]
        if not state.healthy:
            return
        state.healthy = False
        if self.feed is not None:
            self.feed.forget(engine)
        else:
            self.index.reset_engine(engine)

    def mark_up(self, engine: str) -> None:
        state = self.table[engine]
        state.failures = 0
        if state.healthy:
            return
        state.healthy = True
        if self.feed is not None:
            self.feed.resync(engine)

    async def scrape(self, client: httpx.AsyncClient) -> None:
        """Read every engine's ``/metrics`` once (concurrently): load and health."""
        states = [s for s in self.table.values() if s.url is not None]
        await asyncio.gather(*(self._scrape_one(client, s) for s in states))

    async def _scrape_one(self, client: httpx.AsyncClient, state: EngineState) -> None:
        try:
            reply = await client.get(f"{state.url}/metrics", timeout=self.settings.scrape_timeout_s)
            reply.raise_for_status()
            scraped = parse_vllm_metrics(reply.text)
        except (httpx.HTTPError, ValueError):
            state.failures += 1
            if state.failures >= self.settings.unhealthy_after:
                self.mark_down(state.name)
            return
        if self.settings.load_source == "metrics":
            state.reported = scraped.load
        self.mark_up(state.name)

    def health(self) -> dict[str, Any]:
        """The router's state for ``/healthz``: ``status`` is ``ok`` (the feed runs and
        every engine is up), ``degraded`` (some engine is up, another is down or its
        feed stale), ``no engine up`` or ``feed stopped``; per engine its ``state`` and
        the feed's counters."""
        stats = self.feed.stats() if self.feed is not None else {}
        feed_ok = self.feed is None or self.feed.alive
        error = None if self.feed is None or self.feed.error is None else repr(self.feed.error)
        engines = {
            name: {
                "state": engine_health(s.healthy, stats.get(name)),
                "healthy": s.healthy,
                **(stats[name]._asdict() if name in stats else {}),
            }
            for name, s in self.table.items()
        }
        states = {e["state"] for e in engines.values()}
        if not feed_ok:
            status = "feed stopped"
        elif UP not in states and STALE not in states:
            status = "no engine up"
        else:
            status = "ok" if states == {UP} else "degraded"
        return {"status": status, "error": error, "engines": engines}

    def metrics(self) -> bytes:
        return generate_latest(self.registry)


class _StateCollector:
    """Engines' health and load, index size, and the feed's counters at scrape time."""

    def __init__(self, service: RouteService) -> None:
        self.service = service

    def collect(self) -> Iterable[Metric]:
        svc = self.service
        up = GaugeMetricFamily(
            "pagedkv_engine_up", "Engine in routing (1) or out", labels=["engine"]
        )
        flight = GaugeMetricFamily(
            "pagedkv_engine_in_flight", "Requests forwarded, not finished", labels=["engine"]
        )
        load = GaugeMetricFamily(
            "pagedkv_engine_requests", "Running + waiting requests reported", labels=["engine"]
        )
        for name, state in svc.table.items():
            up.add_metric([name], 1.0 if state.healthy else 0.0)
            flight.add_metric([name], state.in_flight)
            load.add_metric([name], state.reported.requests)
        yield from (up, flight, load)
        yield GaugeMetricFamily(
            "pagedkv_index_entries", "Indexed (scope, hash) entries", value=len(svc.index)
        )
        yield CounterMetricFamily(
            "pagedkv_index_evictions", "Entries forgotten past the index's bound",
            value=svc.index.num_index_evictions,
        )  # fmt: skip
        if svc.feed is not None:
            yield from _feed_metrics(svc.feed)


_FEED_COUNTERS = {
    "batches": "Event batches applied",
    "gaps": "Sequence gaps seen (missed batches asked by replay)",
    "recovered": "Gap batches recovered by replay",
    "replayed": "Batches that came by replay (gaps, and tails after a quiet spell)",
    "lost": "Batches replay could not recover",
    "restarts": "Publisher restarts detected",
    "decode_errors": "Malformed messages",
    "replay_timeouts": "Replay requests unanswered",
}


def _feed_metrics(feed: IndexFeed) -> Iterable[Metric]:
    """Per engine the feed's counters, the age of its events, its replay state."""
    stats = feed.stats()
    for field, doc in _FEED_COUNTERS.items():
        family = CounterMetricFamily(f"pagedkv_feed_{field}", doc, labels=["engine"])
        for name, s in stats.items():
            family.add_metric([name], getattr(s, field))
        yield family
    now = time.time()
    age = GaugeMetricFamily(
        "pagedkv_feed_event_age_seconds",
        "Now minus the last applied batch's timestamp (the engine's clock)", labels=["engine"],
    )  # fmt: skip
    since = GaugeMetricFamily(
        "pagedkv_feed_seconds_since_batch",
        "Seconds since the feed applied the engine's last batch (the router's clock)",
        labels=["engine"],
    )  # fmt: skip
    unanswered = GaugeMetricFamily(
        "pagedkv_feed_replay_unanswered", "Replay requests unanswered in a row",
        labels=["engine"],
    )  # fmt: skip
    for name, s in stats.items():
        if s.last_batch_ts is not None:
            age.add_metric([name], max(0.0, now - s.last_batch_ts))
        if s.seconds_since_batch is not None:
            since.add_metric([name], s.seconds_since_batch)
        unanswered.add_metric([name], s.replay_unanswered)
    yield from (age, since, unanswered)
    yield GaugeMetricFamily(
        "pagedkv_feed_replays_open", "Replay requests holding a socket now",
        value=feed.replays_open,
    )  # fmt: skip


# -- forwarding ---------------------------------------------------------------------
_FORWARDED_HEADERS = ("content-type", "accept")
# Failures before any answer came back: the engine is gone (refused, reset, closed a
# kept-alive connection), so the request is safe to send to another engine.
_CONNECT_ERRORS = (
    httpx.ConnectError,
    httpx.ConnectTimeout,
    httpx.ReadError,
    httpx.WriteError,
    httpx.RemoteProtocolError,
)


class _Forwarder:
    """Sends a request body to the chosen engine, retrying others while connections
    are refused, and relays the answer."""

    def __init__(self, service: RouteService, client: httpx.AsyncClient) -> None:
        self.service = service
        self.client = client

    async def forward(self, request: Request, path: str, chat: bool) -> Response:
        svc = self.service
        try:
            raw = await read_body(request, svc.settings.max_body_bytes)
            body = parse_json_object(raw)
            hashes = await run_in_threadpool(svc.openai_hashes, body, chat)
        except HTTPError as exc:
            return error_response(exc.status, exc.message, exc.kind)
        except (ValueError, PagedKVError) as exc:
            return error_response(400, str(exc))
        headers = {h: request.headers[h] for h in _FORWARDED_HEADERS if h in request.headers}
        if svc.settings.engine_api_key:
            headers["authorization"] = f"Bearer {svc.settings.engine_api_key}"
        tried: list[str] = []
        while True:
            choice = await run_in_threadpool(svc.choose, hashes, tried)
            if choice is None:
                return error_response(503, "no engine is up", "service_unavailable")
            state = svc.table[choice.engine]
            state.in_flight += 1
            try:
                # httpx's own timeouts cover socket reads; this also bounds a transport
                # that never reaches a socket, so no client waits forever
                async with asyncio.timeout(svc.settings.request_timeout_s):
                    reply = await self.client.send(
                        self.client.build_request(
                            "POST", f"{state.url}{path}", content=raw, headers=headers
                        ),
                        stream=True,
                    )
            except _CONNECT_ERRORS:
                state.in_flight -= 1
                svc.forward_errors.labels(choice.engine, "connect").inc()
                svc.mark_down(choice.engine)
                tried.append(choice.engine)
                continue
            except (httpx.HTTPError, TimeoutError) as exc:
                state.in_flight -= 1
                svc.forward_errors.labels(choice.engine, "timeout").inc()
                message = f"engine {choice.engine} did not answer: {exc!r}"
                return error_response(504, message, "timeout")
            state.forwarded += 1
            if body.get("stream") is True and reply.status_code == 200:
                return StreamingResponse(
                    self._relay_stream(reply, state),
                    status_code=reply.status_code,
                    media_type=reply.headers.get("content-type", "text/event-stream"),
                )
            return await self._relay_whole(reply, state)

    async def _relay_whole(self, reply: httpx.Response, state: EngineState) -> Response:
        try:
            async with asyncio.timeout(self.service.settings.request_timeout_s):
                content = await reply.aread()
        except (httpx.HTTPError, TimeoutError) as exc:
            self.service.forward_errors.labels(state.name, "read").inc()
            message = f"engine {state.name} failed mid-answer: {exc!r}"
            return error_response(502, message, "engine_error")
        finally:
            state.in_flight -= 1
            await reply.aclose()
        kind = reply.headers.get("content-type", "application/json")
        return Response(content, status_code=reply.status_code, media_type=kind)

    async def _relay_stream(
        self, reply: httpx.Response, state: EngineState
    ) -> AsyncIterator[bytes]:
        chunks = reply.aiter_raw()
        try:
            while True:
                try:
                    async with asyncio.timeout(self.service.settings.request_timeout_s):
                        chunk = await anext(chunks)
                except StopAsyncIteration:
                    break
                yield chunk
        except (httpx.HTTPError, TimeoutError) as exc:
            self.service.forward_errors.labels(state.name, "read").inc()
            error = {"message": f"engine {state.name} failed mid-stream: {exc!r}", "code": 502}
            yield f"\n\ndata: {json.dumps({'error': error})}\n\ndata: [DONE]\n\n".encode()
        finally:
            state.in_flight -= 1
            await reply.aclose()


def create_app(
    service: RouteService, transport: httpx.AsyncBaseTransport | None = None
) -> Starlette:
    """The ASGI app over ``service`` (serve it with uvicorn). Its lifespan runs the
    scraper and owns the HTTP client to the engines (over ``transport``: tests)."""
    settings = service.settings
    forwarder: _Forwarder | None = None

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        nonlocal forwarder
        timeout = httpx.Timeout(settings.request_timeout_s, connect=settings.connect_timeout_s)
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
        async with httpx.AsyncClient(
            timeout=timeout, limits=limits, trust_env=False, transport=transport
        ) as client:
            forwarder = _Forwarder(service, client)
            task = asyncio.create_task(_scrape_forever(service, client))
            try:
                yield
            finally:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    async def completions(request: Request) -> Response:
        if forwarder is None:  # the lifespan has not run
            return error_response(503, "the router is not started", "service_unavailable")
        return await forwarder.forward(request, "/v1/completions", chat=False)

    async def chat_completions(request: Request) -> Response:
        if forwarder is None:
            return error_response(503, "the router is not started", "service_unavailable")
        return await forwarder.forward(request, "/v1/chat/completions", chat=True)

    async def route(request: Request, explain: bool = False) -> Response:
        try:
            raw = await read_body(request, settings.max_body_bytes)
            body = parse_json_object(raw)
            answer = await run_in_threadpool(service.route, body, explain)
            return JSONResponse(answer)
        except HTTPError as exc:
            return error_response(exc.status, exc.message, exc.kind)
        except (ValueError, PagedKVError) as exc:
            return error_response(400, str(exc))

    async def admin_route(request: Request) -> Response:
        return await route(request, explain=True)

    async def load(request: Request) -> Response:
        engine = request.path_params["name"]
        try:
            body = parse_json_object(await read_body(request, settings.max_body_bytes))
            service.set_load(engine, body)
        except KeyError:
            return error_response(404, f"unknown engine {engine!r}")
        except HTTPError as exc:
            return error_response(exc.status, exc.message, exc.kind)
        except ValueError as exc:
            return error_response(400, str(exc))
        return JSONResponse({"engine": engine, **service.table[engine].reported._asdict()})

    async def healthz(request: Request) -> Response:
        health = service.health()
        ok = health["status"] in HEALTHY_STATUSES
        return JSONResponse(health, status_code=200 if ok else 503)

    async def metrics(request: Request) -> Response:
        return Response(service.metrics(), media_type=CONTENT_TYPE_LATEST)

    routes = [
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/route", route, methods=["POST"]),
        Route("/engines/{name}/load", load, methods=["POST"]),
        Route("/healthz", healthz),
        Route("/metrics", metrics),
    ]
    # an admin key also opens the client endpoints
    keys = settings.api_keys + settings.admin_api_keys if settings.api_keys else ()
    middleware = [Middleware(ApiKeyMiddleware, keys=keys)]
    if settings.admin_api_keys:
        routes.append(Route("/admin/route", admin_route, methods=["POST"]))
        middleware.append(
            Middleware(ApiKeyMiddleware, keys=settings.admin_api_keys, prefixes=("/admin",))
        )
    return Starlette(routes=routes, middleware=middleware, lifespan=lifespan)


async def _scrape_forever(service: RouteService, client: httpx.AsyncClient) -> None:
    if not any(s.url for s in service.table.values()):
        return
    while True:
        await service.scrape(client)
        await asyncio.sleep(service.settings.scrape_interval_s)
