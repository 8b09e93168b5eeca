"""``pagedkv serve``'s HTTP side: an OpenAI-compatible server over an :class:`OnlineEngine`.

    POST /v1/completions        {"prompt": str | [ids], "max_tokens"?, "stream"?}
    POST /v1/chat/completions   {"messages": [...], "max_tokens"? | "max_completion_tokens"?,
                                 "stream"?}
    GET  /v1/models, /health, /metrics (vLLM's metric names)
    POST /reset_prefix_cache    forget every cached block (vLLM's endpoint of that name)

Decoding is greedy (temperature and sampling fields are accepted and ignored). Streams
are server-sent events ending with ``data: [DONE]``; a client that goes away cancels its
request. ``api_keys`` guards ``/v1`` as vLLM's ``--api-key`` does, and also
``/reset_prefix_cache``.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from pagedkv.cluster.http import (
    DEFAULT_MAX_BODY_BYTES,
    ApiKeyMiddleware,
    HTTPError,
    error_response,
    read_json_object,
)
from pagedkv.errors import ConfigError
from pagedkv.hf.online import OnlineEngine
from pagedkv.hf.tokenizer import ChatTokenizer, IncrementalDetokenizer

__all__ = ["ServedModel", "create_engine_app"]

DEFAULT_MAX_TOKENS = 16
_END = object()


@dataclass
class ServedModel:
    """An engine, its tokenizer and the name clients ask for."""

    engine: OnlineEngine
    tokenizer: ChatTokenizer
    name: str
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    api_keys: tuple[str, ...] = ()
    created: int = field(default_factory=lambda: int(time.time()))


class _EngineCollector:
    """vLLM's metric names, read from the engine's counters at each scrape."""

    def __init__(self, served: ServedModel) -> None:
        self.served = served

    def collect(self) -> Iterable[Metric]:
        c = self.served.engine.counters()
        labels = ["model_name", "engine"]
        values = [self.served.name, "0"]

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            metric = GaugeMetricFamily(name, doc, labels=labels)
            metric.add_metric(values, value)
            return metric

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            metric = CounterMetricFamily(name, doc, labels=labels)
            metric.add_metric(values, value)
            return metric

        yield gauge("vllm:num_requests_running", "Requests in the running batch", c.num_running)
        yield gauge("vllm:num_requests_waiting", "Requests waiting to run", c.num_waiting)
        yield gauge("vllm:kv_cache_usage_perc", "KV cache usage, 1 = full", c.kv_cache_usage)
        yield counter("vllm:prompt_tokens", "Prompt tokens received", c.prompt_tokens)
        yield counter("vllm:generation_tokens", "Tokens generated", c.generation_tokens)
        yield counter(
            "vllm:prefix_cache_queries", "Prompt tokens looked up", c.prefix_cache_queries
        )
        yield counter("vllm:prefix_cache_hits", "Prompt tokens found cached", c.prefix_cache_hits)
        yield counter("vllm:num_preemptions", "Preemptions", c.preemptions)
        success = CounterMetricFamily(
            "vllm:request_success", "Finished requests", labels=[*labels, "finished_reason"]
        )
        for reason, count in sorted(c.finished.items()):
            success.add_metric([*values, reason], count)
        yield success


def _max_tokens(body: dict[str, Any], chat: bool) -> int:
    value = body.get("max_completion_tokens") if chat else None
    value = body.get("max_tokens") if value is None else value
    if value is None:
        return DEFAULT_MAX_TOKENS
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise HTTPError(400, "max_tokens must be a positive integer")
    return value


class _Completion:
    """One request on the engine: its tokens arrive on an asyncio queue."""

    def __init__(self, served: ServedModel, prompt: list[int], max_tokens: int) -> None:
        self.served = served
        self.prompt = prompt
        self.queue: asyncio.Queue[tuple[int | None, str | None]] = asyncio.Queue()
        loop = asyncio.get_running_loop()

        def sink(token: int | None, reason: str | None) -> None:
            loop.call_soon_threadsafe(self.queue.put_nowait, (token, reason))

        try:
            self.request_id = served.engine.submit(prompt, max_tokens, sink)
        except ConfigError as exc:
            raise HTTPError(400, str(exc)) from None
        except OverflowError as exc:
            raise HTTPError(503, str(exc), "service_unavailable") from None
        self.finish_reason: str | None = None

    async def tokens(self) -> AsyncIterator[int]:
        """The generated tokens; ``finish_reason`` is set once they end. An abandoned
        iteration (client gone) cancels the request."""
        try:
            while True:
                token, reason = await self.queue.get()
                if token is None:
                    self.finish_reason = reason
                    return
                yield token
        finally:
            if self.finish_reason is None:
                self.served.engine.abort(self.request_id)


def _sse(payload: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n".encode()


def create_engine_app(served: ServedModel) -> Starlette:
    """The ASGI app (serve it with uvicorn)."""
    registry = CollectorRegistry()
    registry.register(_EngineCollector(served))

    async def prepare(request: Request, chat: bool) -> tuple[dict[str, Any], _Completion]:
        body = await read_json_object(request, served.max_body_bytes)
        max_tokens = _max_tokens(body, chat)
        try:
            prompt = await run_in_threadpool(served.tokenizer.prompt_ids, body, chat)
        except ValueError as exc:
            raise HTTPError(400, str(exc)) from None
        return body, _Completion(served, prompt, max_tokens)

    async def completions(request: Request) -> Response:
        return await handle(request, chat=False)

    async def chat_completions(request: Request) -> Response:
        return await handle(request, chat=True)

    async def handle(request: Request, chat: bool) -> Response:
        try:
            body, completion = await prepare(request, chat)
        except HTTPError as exc:
            return error_response(exc.status, exc.message, exc.kind)
        prefix = "chatcmpl" if chat else "cmpl"
        rid = f"{prefix}-{uuid.uuid4().hex}"
        if body.get("stream") is True:
            return StreamingResponse(_stream(completion, rid, chat), media_type="text/event-stream")
        tokens = [t async for t in completion.tokens()]
        if completion.finish_reason not in ("length", "stop"):
            return error_response(500, f"generation failed: {completion.finish_reason}")
        text = served.tokenizer.decode(tokens)
        choice: dict[str, Any] = {"index": 0, "finish_reason": completion.finish_reason}
        if chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice |= {"text": text, "logprobs": None}
        num_prompt = len(completion.prompt)
        return JSONResponse(
            {
                "id": rid,
                "object": "chat.completion" if chat else "text_completion",
                "created": int(time.time()),
                "model": served.name,
                "choices": [choice],
                "usage": {
                    "prompt_tokens": num_prompt,
                    "completion_tokens": len(tokens),
                    "total_tokens": num_prompt + len(tokens),
                },
            }
        )

    async def _stream(completion: _Completion, rid: str, chat: bool) -> AsyncIterator[bytes]:
        obj = "chat.completion.chunk" if chat else "text_completion"
        head = {"id": rid, "object": obj, "created": int(time.time()), "model": served.name}

        def chunk(text: str, reason: str | None, first: bool = False) -> bytes:
            if chat:
                delta: dict[str, Any] = (
                    {"role": "assistant", "content": text}
                    if first
                    else ({"content": text} if text else {})
                )
                choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": reason}
            else:
                choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": reason}
            return _sse({**head, "choices": [choice]})

        if chat:
            yield chunk("", None, first=True)
        detok = IncrementalDetokenizer(served.tokenizer)
        async for token in completion.tokens():
            delta = detok.push(token)
            if delta:
                yield chunk(delta, None)
        if completion.finish_reason not in ("length", "stop"):
            error = {"message": f"generation failed: {completion.finish_reason}", "code": 500}
            yield _sse({"error": error})
            yield b"data: [DONE]\n\n"
            return
        yield chunk(detok.flush(), completion.finish_reason)
        yield b"data: [DONE]\n\n"

    async def models(request: Request) -> Response:
        model = {"id": served.name, "object": "model", "created": served.created}
        return JSONResponse({"object": "list", "data": [{**model, "owned_by": "pagedkv"}]})

    async def health(request: Request) -> Response:
        if not served.engine.alive:
            return error_response(503, f"the engine stopped: {served.engine.error!r}")
        return Response(status_code=200)

    async def metrics(request: Request) -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    async def reset_prefix_cache(request: Request) -> Response:
        if not await run_in_threadpool(served.engine.reset_prefix_cache):
            return error_response(409, "blocks are in use: try again when requests finish")
        return Response(status_code=200)

    guarded = ("/v1", "/reset_prefix_cache")
    middleware = [Middleware(ApiKeyMiddleware, keys=served.api_keys, prefixes=guarded)]
    return Starlette(
        routes=[
            Route("/v1/completions", completions, methods=["POST"]),
            Route("/v1/chat/completions", chat_completions, methods=["POST"]),
            Route("/v1/models", models),
            Route("/health", health),
            Route("/metrics", metrics),
            Route("/reset_prefix_cache", reset_prefix_cache, methods=["POST"]),
        ],
        middleware=middleware,
    )
