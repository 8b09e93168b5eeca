"""``pagedkv route serve``: subscribe to engines' KV events and answer route queries."""

from __future__ import annotations

from typing import NamedTuple

import typer

from pagedkv.cli.common import stderr_console
from pagedkv.errors import ConfigError

__all__ = [
    "route_app",
    "EngineSpec",
    "parse_engines",
    "parse_listen",
    "serve_command",
    "simulate_engine_command",
]

route_app = typer.Typer(
    help="KV-aware routing over engines' KV events (vLLM's or pagedkv's).", no_args_is_help=True
)


class EngineSpec(NamedTuple):
    name: str
    endpoint: str
    replay_endpoint: str | None
    url: str | None = None


def parse_engines(
    engines: str, replay_endpoints: str | None, urls: str | None = None
) -> list[EngineSpec]:
    """``[NAME=]PUB,...`` plus optional replay and HTTP addresses in the same order."""
    entries = [e.strip() for e in engines.split(",") if e.strip()]
    replays = [r.strip() for r in replay_endpoints.split(",")] if replay_endpoints else []
    https = [u.strip().rstrip("/") for u in urls.split(",")] if urls else []
    if https and len(https) != len(entries):
        raise ConfigError(
            f"--engine-urls: {len(https)} addresses for {len(entries)} engines; give one per "
            "engine, in the same order"
        )
    for url in https:
        if not url.startswith(("http://", "https://")):
            raise ConfigError(f"--engine-urls: {url!r} is not an http:// or https:// address")
    if not entries:
        raise ConfigError("--engines: give at least one engine address (tcp://host:5557)")
    if replays and len(replays) != len(entries):
        raise ConfigError(
            f"--replay-endpoints: {len(replays)} addresses for {len(entries)} engines; give "
            "one per engine, in the same order"
        )
    specs = []
    for i, entry in enumerate(entries):
        name, _, endpoint = entry.rpartition("=") if "=" in entry else ("", "", entry)
        if "://" not in endpoint:
            raise ConfigError(f"--engines: {entry!r} is not a ZeroMQ address (tcp://host:port)")
        replay = (replays[i] or None) if replays else None
        specs.append(EngineSpec(name or endpoint, endpoint, replay, https[i] if https else None))
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise ConfigError("--engines: two engines have the same name")
    return specs


def parse_listen(listen: str) -> tuple[str, int]:
    host, _, port = listen.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"--listen: expected HOST:PORT, got {listen!r}")
    return host, int(port)


@route_app.command("serve")
def serve_command(
    engines: str = typer.Option(
        ..., "--engines", help="Engines' KV event addresses: [NAME=]tcp://host:5557,..."
    ),
    replay_endpoints: str | None = typer.Option(
        None, "--replay-endpoints", help="Their replay addresses, same order (recommended)."
    ),
    engine_urls: str | None = typer.Option(
        None,
        "--engine-urls",
        help="Their OpenAI HTTP addresses, same order (http://127.0.0.1:8001,...): requests "
        "are forwarded there, load is scraped from their /metrics.",
    ),
    tokenizer: str | None = typer.Option(
        None,
        "--tokenizer",
        help="Model directory whose tokenizer and chat template the engines use.",
    ),
    tiny_tokenizer: bool = typer.Option(
        False, "--tiny-tokenizer", help="The byte tokenizer of `pagedkv serve --tiny`."
    ),
    listen: str = typer.Option("127.0.0.1:8000", "--listen", help="HOST:PORT to serve on."),
    router: str = typer.Option(
        "balanced", "--router", help="balanced, round-robin, least-loaded, prefix, cost."
    ),
    api_key: str | None = typer.Option(
        None,
        "--api-key",
        help="Require 'Authorization: Bearer KEY' on every endpoint [$PAGEDKV_API_KEY].",
    ),
    admin_api_key: str | None = typer.Option(
        None,
        "--admin-api-key",
        help="Enables /admin/route (per-engine cached blocks) for this key.",
    ),
    engine_api_key: str | None = typer.Option(
        None, "--engine-api-key", help="Key sent to the engines [$PAGEDKV_ENGINE_API_KEY]."
    ),
    load_source: str = typer.Option(
        "metrics",
        "--load-source",
        help="metrics (scrape /metrics) or post (POST /engines/NAME/load).",
    ),
    scrape_interval_s: float = typer.Option(1.0, "--scrape-interval", min=0.05),
    request_timeout_s: float = typer.Option(
        300.0, "--request-timeout", min=0.1, help="Longest an engine may stay silent mid-answer."
    ),
    max_body_bytes: str = typer.Option("8MiB", "--max-body-bytes"),
    block_size: int = typer.Option(16, "--block-size", min=1, help="The engines' block size."),
    hash_algo: str | None = typer.Option(
        None, "--hash-algo", help="The engines' hash algorithm [the runtime's default]."
    ),
    topic: str = typer.Option("", "--topic", help="The engines' KV event topic."),
    max_index_blocks: int | None = typer.Option(
        None, "--max-index-blocks", min=1, help="Bound the index (entries per medium and group)."
    ),
) -> None:
    """Forward OpenAI requests to the engine holding the most of their prefix, weighed
    against load; also POST /route, /healthz and /metrics.
    \f
    Args:
        scrape_interval_s: seconds between scrapes of each engine's /metrics.
        max_body_bytes: the largest request body accepted, e.g. 8MiB.
    """
    if hash_algo == "builtin":
        raise typer.BadParameter(
            "Python's hash differs between processes, so the router's block hashes would never "
            "match the engines'; use the engines' own algorithm (vLLM's default: sha256)",
            param_hint="--hash-algo builtin",
        )
    try:
        import uvicorn

        from pagedkv.cluster.service import RouteService, create_app
    except ImportError:
        raise ConfigError(
            "route serve needs the route extra: pip install 'pagedkv[route]'"
        ) from None
    import os

    from pagedkv.cli.common import parse_bytes
    from pagedkv.cluster import KVIndex, PromptHasher, make_router
    from pagedkv.cluster.feed import EngineEndpoints, IndexFeed
    from pagedkv.cluster.service import RouterSettings

    specs = parse_engines(engines, replay_endpoints, engine_urls)
    host, port = parse_listen(listen)
    if load_source not in ("metrics", "post"):
        raise ConfigError(f"--load-source: metrics or post, got {load_source!r}")
    index = KVIndex(max_blocks=max_index_blocks)
    ends = {s.name: EngineEndpoints(s.endpoint, s.replay_endpoint) for s in specs}
    chat_tokenizer = None
    if tokenizer is not None or tiny_tokenizer:
        from pagedkv.hf.tokenizer import load_chat_tokenizer

        chat_tokenizer = load_chat_tokenizer(tokenizer, tiny=tiny_tokenizer)
    elif engine_urls:
        raise ConfigError(
            "--engine-urls forwards requests: give --tokenizer (or --tiny-tokenizer) so the "
            "router can find their prompts' cached blocks"
        )
    key = api_key or os.environ.get("PAGEDKV_API_KEY")
    settings = RouterSettings(
        load_source=load_source,
        scrape_interval_s=scrape_interval_s,
        request_timeout_s=request_timeout_s,
        max_body_bytes=parse_bytes(max_body_bytes, "--max-body-bytes"),
        api_keys=(key,) if key else (),
        admin_api_keys=(admin_api_key,) if admin_api_key else (),
        engine_api_key=engine_api_key or os.environ.get("PAGEDKV_ENGINE_API_KEY"),
    )
    service = RouteService(
        index, make_router(router), PromptHasher(block_size, hash_algo),
        {s.name: s.url for s in specs}, tokenizer=chat_tokenizer, settings=settings,
    )  # fmt: skip
    with IndexFeed(index, ends, topic=topic) as feed:
        service.feed = feed
        stderr_console().print(f"routing {len(specs)} engines with {router} on http://{listen}")
        uvicorn.run(create_app(service), host=host, port=port, log_level="warning")


@route_app.command("simulate-engine")
def simulate_engine_command(
    endpoint: str = typer.Option("tcp://*:5557", "--endpoint", help="PUB address."),
    replay_endpoint: str | None = typer.Option(
        "tcp://*:5558", "--replay-endpoint", help="Replay (ROUTER) address; '' for none."
    ),
    model: str = typer.Option("Llama-3.1-8B", "--model", help="Bundled model name."),
    num_blocks: int = typer.Option(4096, "--num-blocks", min=2, help="KV cache blocks."),
    trace: str = typer.Option("synthetic:200", "--trace", help="Trace to replay."),
    step_delay_ms: float = typer.Option(
        1.0, "--step-delay-ms", min=0.0, help="Wall time between steps."
    ),
    wait_s: float = typer.Option(
        1.0, "--wait", min=0.0, help="Seconds to wait before the first step and before closing."
    ),
    topic: str = typer.Option("", "--topic", help="KV event topic."),
    hash_algo: str | None = typer.Option(None, "--hash-algo", help="Block hash algorithm."),
) -> None:
    """A simulated engine: replay a trace through a KVCacheManager and publish its KV events
    over ZeroMQ in vLLM's wire format (to test a router or a subscriber)."""
    import dataclasses
    import time

    from pagedkv.events import KVEventsConfig
    from pagedkv.sim.fleet.publish import publish_replay
    from pagedkv.sim.setup import setup_from_model
    from pagedkv.sim.traces.bundled import load_trace

    config = KVEventsConfig(endpoint=endpoint, replay_endpoint=replay_endpoint or None, topic=topic)
    setup = dataclasses.replace(setup_from_model(model, num_blocks=num_blocks), hash_algo=hash_algo)
    console = stderr_console()

    def started(publisher: object) -> None:
        console.print(
            f"publishing on {getattr(publisher, 'endpoint', endpoint)} "
            f"(replay {getattr(publisher, 'replay_endpoint', None)})"
        )
        time.sleep(wait_s)

    run = publish_replay(
        setup, load_trace(trace), config, step_delay_s=step_delay_ms / 1000,
        on_started=started, before_close=lambda _: time.sleep(wait_s),
    )  # fmt: skip
    console.print(
        f"{run.num_batches} batches published ({run.num_dropped} dropped), "
        f"{len(run.cached_hashes)} blocks cached at the end, hit rate "
        f"{100 * run.result.hit_rate:.2f} %"
    )
