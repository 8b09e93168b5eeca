"""The route service: a Starlette app answering "which engine for this prompt?" from a
KVIndex kept current by an IndexFeed (``route`` extra: starlette, uvicorn, prometheus).

    POST /route                 {"token_ids": [...], "lora_name"?, "lora_path"?, "cache_salt"?}
                                or {"block_hashes": [...]}  ->  {"engine", "cached_blocks", ...}
    POST /engines/{name}/load   {"running", "waiting", "kv_usage"}  (what the engine reports)
    GET  /healthz               feed state per engine (503 once the feed thread stopped)
    GET  /metrics               Prometheus text format
"""

from __future__ import annotations

import time
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from pagedkv.cluster.feed import IndexFeed
from pagedkv.cluster.hashing import PromptHasher
from pagedkv.cluster.index import KVIndex
from pagedkv.cluster.routing import EngineLoad, Router
from pagedkv.errors import PagedKVError

MAX_PROMPT_TOKENS = 1 << 21


class RouteService:
    """State behind the HTTP API: index, router, prompt hasher, reported loads, metrics."""

    def __init__(
        self,
        index: KVIndex,
        router: Router,
        hasher: PromptHasher,
        engines: list[str],
        feed: IndexFeed | None = None,
    ) -> None:
        self.index = index
        self.router = router
        self.hasher = hasher
        self.engines = engines
        self.feed = feed
        self.loads = dict.fromkeys(engines, EngineLoad())
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
        self.latency = Histogram(
            "pagedkv_route_seconds", "Time to answer a route query", registry=self.registry,
            buckets=(1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3, 1.0),
        )  # fmt: skip
        self.entries = Gauge(
            "pagedkv_index_entries", "Indexed (scope, hash) entries", registry=self.registry
        )
        self.batches = Gauge(
            "pagedkv_feed_batches", "Event batches applied, by engine", ["engine"],
            registry=self.registry,
        )  # fmt: skip
        self.lost = Gauge(
            "pagedkv_feed_lost_batches", "Batches replay could not recover, by engine",
            ["engine"], registry=self.registry,
        )  # fmt: skip

    def route(self, body: dict[str, Any]) -> dict[str, Any]:
        t0 = time.perf_counter()
        hashes = self._hashes(body)
        loads = [self.loads[e] for e in self.engines]
        lock = self.feed.lock if self.feed is not None else None
        if lock is not None:
            lock.acquire()
        try:
            counts = self.index.prefix_blocks(hashes)
            by_name = dict(zip(self.index.engines, counts))
        finally:
            if lock is not None:
                lock.release()
        cached = [by_name.get(e, 0) for e in self.engines]
        engine = self.engines[self.router.choose(cached, loads, len(hashes))]
        self.routed.labels(engine).inc()
        self.cached.inc(by_name.get(engine, 0))
        self.prompt.inc(len(hashes))
        self.latency.observe(time.perf_counter() - t0)
        return {
            "engine": engine,
            "router": self.router.name,
            "num_prompt_blocks": len(hashes),
            "cached_blocks": dict(zip(self.engines, cached)),
        }

    def _hashes(self, body: dict[str, Any]) -> list[Any]:
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

    def set_load(self, engine: str, body: dict[str, Any]) -> None:
        if engine not in self.loads:
            raise KeyError(engine)
        try:
            load = EngineLoad(
                int(body.get("running", 0)),
                int(body.get("waiting", 0)),
                float(body.get("kv_usage", 0.0)),
            )
        except (TypeError, ValueError):
            raise ValueError("running and waiting must be integers, kv_usage a number") from None
        self.loads[engine] = load

    def health(self) -> dict[str, Any]:
        stats = self.feed.stats() if self.feed is not None else {}
        feed_ok = self.feed is None or self.feed.alive
        error = None if self.feed is None or self.feed.error is None else repr(self.feed.error)
        return {
            "status": "ok" if feed_ok else "feed stopped",
            "error": error,
            "engines": {name: s._asdict() for name, s in stats.items()},
            "index_entries": len(self.index),
        }

    def metrics(self) -> bytes:
        self.entries.set(len(self.index))
        if self.feed is not None:
            for name, s in self.feed.stats().items():
                self.batches.labels(name).set(s.batches)
                self.lost.labels(name).set(s.lost)
        return generate_latest(self.registry)


def create_app(service: RouteService) -> Starlette:
    """The ASGI app over ``service`` (serve it with uvicorn)."""

    async def route(request: Request) -> Response:
        try:
            body = await request.json()
            if not isinstance(body, dict):
                raise ValueError("the body must be a JSON object")
            return JSONResponse(service.route(body))
        except (ValueError, PagedKVError) as exc:
            return JSONResponse({"error": str(exc)}, status_code=400)

    async def load(request: Request) -> Response:
        engine = request.path_params["name"]
        try:
            body = await request.json()
            if not isinstance(body, dict):
                raise ValueError("the body must be a JSON object")
            service.set_load(engine, body)
        except KeyError:
            return JSONResponse({"error": f"unknown engine {engine!r}"}, status_code=404)
        except ValueError as exc:
            return JSONResponse({"error": str(exc)}, status_code=400)
        return JSONResponse({"engine": engine, **service.loads[engine]._asdict()})

    async def healthz(request: Request) -> Response:
        health = service.health()
        return JSONResponse(health, status_code=200 if health["status"] == "ok" else 503)

    async def metrics(request: Request) -> Response:
        return Response(service.metrics(), media_type=CONTENT_TYPE_LATEST)

    return Starlette(
        routes=[
            Route("/route", route, methods=["POST"]),
            Route("/engines/{name}/load", load, methods=["POST"]),
            Route("/healthz", healthz),
            Route("/metrics", metrics),
        ]
    )
