"""``pagedkv serve MODEL [--tiny]``: an OpenAI-compatible engine over pagedkv's transformers
engine, with vLLM's metric names and (optionally) KV events in vLLM's wire format."""

from __future__ import annotations

import os
from typing import Any

import typer

from pagedkv.cli.common import BLOCK_SIZE_OPTION, parse_bytes, stderr_console
from pagedkv.errors import ConfigError

__all__ = [
    "API_KEY_ENV",
    "serve_command",
]

API_KEY_ENV = "PAGEDKV_API_KEY"


def _load_model(model: str, tiny: bool, seed: int, vocab_size: int) -> Any:
    from pagedkv.hf.load import load_pretrained, load_tiny_model, use_one_thread

    if tiny:
        use_one_thread()
        return load_tiny_model(model, seed=seed, vocab_size=vocab_size)
    return load_pretrained(model)


def serve_command(
    model: str = typer.Argument(
        ..., help="Model directory (weights + tokenizer), or any config with --tiny."
    ),
    tiny: bool = typer.Option(
        False,
        "--tiny",
        help="MODEL's config shrunk, seeded random weights, a built-in byte tokenizer.",
    ),
    seed: int = typer.Option(0, "--seed", help="Weight seed with --tiny."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on."),
    port: int = typer.Option(8000, "--port", min=0, max=65535),
    api_key: str | None = typer.Option(
        None, "--api-key", help=f"Require 'Authorization: Bearer KEY' on /v1 [${API_KEY_ENV}]."
    ),
    served_model_name: str | None = typer.Option(None, "--served-model-name"),
    kv_cache_memory_bytes: str = typer.Option("64MiB", "--kv-cache-memory-bytes"),
    block_size: int = BLOCK_SIZE_OPTION,
    max_num_seqs: int = typer.Option(8, "--max-num-seqs", min=1),
    max_num_batched_tokens: int = typer.Option(256, "--max-num-batched-tokens", min=1),
    kv_events_endpoint: str | None = typer.Option(
        None,
        "--kv-events-endpoint",
        help="Publish KV events here (bound), e.g. tcp://127.0.0.1:5557; none by default.",
    ),
    kv_events_replay_endpoint: str | None = typer.Option(
        None,
        "--kv-events-replay-endpoint",
        help="Replay (ROUTER) address, e.g. tcp://127.0.0.1:5558.",
    ),
    kv_events_topic: str = typer.Option("", "--kv-events-topic"),
    data_parallel_rank: int = typer.Option(
        0, "--data-parallel-rank", min=0, help="Offsets the event ports by the rank (vLLM's)."
    ),
    max_body_bytes: str = typer.Option("8MiB", "--max-body-bytes", help="Largest request body."),
) -> None:
    """Serve /v1/completions and /v1/chat/completions (streaming too), /metrics, /health.
    \f
    Args:
        port: TCP port to listen on.
        served_model_name: the model name the API reports and accepts (None: MODEL).
        kv_cache_memory_bytes: KV cache size, e.g. 64MiB.
        max_num_seqs: requests running at once.
        max_num_batched_tokens: tokens scheduled per step.
        kv_events_topic: the topic KV event batches are published under.
    """
    try:
        import uvicorn

        from pagedkv.hf.server import ServedModel, create_engine_app
    except ImportError as exc:
        raise ConfigError(
            f"serve needs the hf and route extras: pip install 'pagedkv[hf,route]' ({exc})"
        ) from None
    from pagedkv.hf import PagedGenerator
    from pagedkv.hf.online import OnlineEngine
    from pagedkv.hf.tokenizer import load_chat_tokenizer

    key = api_key or os.environ.get(API_KEY_ENV) or None
    tokenizer = load_chat_tokenizer(model, tiny=tiny)
    hf_model = _load_model(model, tiny, seed, tokenizer.vocab_size)
    generator = PagedGenerator(
        hf_model,
        kv_cache_memory_bytes=parse_bytes(kv_cache_memory_bytes, "--kv-cache-memory-bytes"),
        block_size=block_size,
        max_num_batched_tokens=max_num_batched_tokens,
        max_num_seqs=max_num_seqs,
    )
    publisher = None
    if kv_events_endpoint is not None:
        from pagedkv.events import KVEventsConfig, ZmqEventPublisher

        config = KVEventsConfig(
            endpoint=kv_events_endpoint,
            replay_endpoint=kv_events_replay_endpoint,
            topic=kv_events_topic,
        )
        publisher = ZmqEventPublisher(config, data_parallel_rank=data_parallel_rank, bind=True)
    engine = OnlineEngine(
        generator, publish=None if publisher is None else publisher.publish
    ).start()
    served = ServedModel(
        engine,
        tokenizer,
        served_model_name or model,
        max_body_bytes=parse_bytes(max_body_bytes, "--max-body-bytes"),
        api_keys=(key,) if key else (),
    )
    events = "" if publisher is None else f", KV events on {publisher.endpoint}"
    stderr_console().print(
        f"serving {served.name} ({generator.kv_cache_config.num_blocks} blocks of "
        f"{block_size} tokens) on http://{host}:{port}{events}",
        markup=False,
    )
    try:
        uvicorn.run(create_engine_app(served), host=host, port=port, log_level="warning")
    finally:
        engine.stop()
        if publisher is not None:
            publisher.close()
