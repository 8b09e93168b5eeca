"""What one replay runs on: the setup planned for a model and the trace read for it.

``build_replay`` is ``pagedkv simulate``'s preparation as a library call: the model's config
is read once, the trace is tokenized with the model's tokenizer, and the cache is
planned as ``pagedkv plan`` plans it for a GPU, or with a given block count.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, NamedTuple

from pagedkv.errors import ConfigError
from pagedkv.models import ModelLayout, ModelSource
from pagedkv.sim.setup import SimSetup
from pagedkv.sim.traces.trace import Trace

__all__ = [
    "MAX_NUM_BLOCKS",
    "CacheOptions",
    "LongModelWarning",
    "Replay",
    "TraceOptions",
    "build_replay",
    "check_fits",
]

# The pool keeps a Python object per block: more than this is a typo, not a device.
MAX_NUM_BLOCKS = 2**24


@dataclass(frozen=True)
class TraceOptions:
    """Which trace to replay and how to read it.

    ``trace``: a bundled name, ``synthetic[:N[:SEED]]`` or a file (``load_trace``);
    ``limit``: the first requests only (None or 0: all); ``trace_block_size``: tokens per
    Mooncake hash id (None: Mooncake's 512); ``skip_bad_lines``: skip and count
    malformed lines instead of raising.
    """

    trace: str = "mooncake_conversation"
    limit: int | None = None
    trace_block_size: int | None = None
    skip_bad_lines: bool = False


@dataclass(frozen=True)
class CacheOptions:
    """The KV cache's vLLM flags, and how the simulator caches prefixes.

    ``max_model_len``: tokens (None: the model's; -1: fitted to the memory);
    ``enable_prefix_caching``: None keeps vLLM's default for the model; ``hash_algo``:
    ``builtin`` or one of vLLM's; ``retention``: a name in
    ``config.PREFIX_CACHE_RETENTIONS``; ``revision``: the Hub revision of the model.
    """

    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    block_size: int = 16
    max_model_len: int | None = None
    kv_cache_dtype: str = "auto"
    enable_prefix_caching: bool | None = None
    hash_algo: str = "builtin"
    retention: str = "vllm"
    revision: str | None = None


class Replay(NamedTuple):
    """A setup, the trace to replay on it and the model both were made for."""

    setup: SimSetup
    trace: Trace
    model: ModelSource


# Called when max_model_len is above the model's limit and planned anyway
# (PAGEDKV_ALLOW_LONG_MAX_MODEL_LEN is set): the layout and the length asked for.
LongModelWarning = Callable[[ModelLayout, int | None], None]


def _no_warning(layout: ModelLayout, max_model_len: int | None) -> None:
    return None


def build_replay(
    model: str,
    trace: TraceOptions,
    cache: CacheOptions,
    *,
    gpu: str | None = None,
    num_blocks: int | None = None,
    max_num_seqs: int | None = None,
    max_num_batched_tokens: int | None = None,
    reading: Callable[[], AbstractContextManager[Any]] = contextlib.nullcontext,
    warn_long: LongModelWarning = _no_warning,
) -> Replay:
    """Read ``model`` and ``trace``, and plan the setup the trace replays on.

    Args:
        model: bundled name, directory, config.json or Hub id (at ``cache.revision``).
        trace: the trace and how to read it.
        cache: the cache's flags and prefix caching.
        gpu: plan the cache as ``pagedkv plan`` does for this GPU (None and no
            ``num_blocks``: the default GPU).
        num_blocks: the cache's blocks instead of a GPU (at most ``MAX_NUM_BLOCKS``).
        max_num_seqs: the flag as given, for the activation reserve (None: vLLM's default).
        max_num_batched_tokens: the flag as given, for the activation reserve (None:
            vLLM's default).
        reading: a context around the trace read (a spinner, say).
        warn_long: called when ``cache.max_model_len`` is above the model's limit and
            planned anyway (``PAGEDKV_ALLOW_LONG_MAX_MODEL_LEN`` is set).
    """
    from pagedkv.models import load_model_config
    from pagedkv.models.tokenizer import TextTokenizer
    from pagedkv.sim.traces.bundled import load_trace
    from pagedkv.sim.traces.readers import MOONCAKE_BLOCK_TOKENS

    if gpu is not None and num_blocks is not None:
        raise ConfigError("--gpu and --num-blocks are alternatives; give one")
    if num_blocks is not None and num_blocks > MAX_NUM_BLOCKS:
        raise ConfigError(
            f"--num-blocks {num_blocks:,} is more than {MAX_NUM_BLOCKS:,} blocks (the pool "
            "keeps an object per block); give a smaller count or --gpu"
        )
    source = load_model_config(model, revision=cache.revision)
    tokenizer = TextTokenizer(source.path.parent if source.path else model, cache.revision)
    with reading():
        loaded = load_trace(
            trace.trace,
            skip_bad_lines=trace.skip_bad_lines,
            limit=trace.limit or None,
            block_tokens=trace.trace_block_size or MOONCAKE_BLOCK_TOKENS,
            tokenize=tokenizer,
        )
    if num_blocks is not None:
        setup = _setup_with_blocks(source, num_blocks, cache, warn_long)
    else:
        flags = (max_num_seqs, max_num_batched_tokens)
        setup = _planned_setup(source, gpu, cache, flags, warn_long)
    config = setup.config
    if cache.enable_prefix_caching is not None:
        config = config.replace(enable_prefix_caching=cache.enable_prefix_caching)
    setup = dataclasses.replace(
        setup, hash_algo=cache.hash_algo, config=config, retention=cache.retention
    )
    return Replay(setup, loaded, source)


def check_fits(replay: Replay, num_blocks: int | None) -> None:
    """Refuse a replay in which every request would be rejected (a table of zeros)."""
    max_len = replay.setup.max_model_len
    requests = replay.trace.requests
    shortest = min((r.num_prompt_tokens for r in requests), default=0)
    if not requests or shortest < max_len:
        return
    why = (
        f"--num-blocks {num_blocks:,} holds requests of fewer than {max_len:,} tokens"
        if num_blocks is not None
        else f"max_model_len is {max_len:,}"
    )
    raise ConfigError(
        f"{why}, and every one of the {len(requests):,} requests of {replay.trace.name} has a "
        f"prompt of {shortest:,} tokens or more: nothing to replay; give more blocks or a "
        "larger --max-model-len"
    )


def _setup_with_blocks(
    source: ModelSource, num_blocks: int, cache: CacheOptions, warn_long: LongModelWarning
) -> SimSetup:
    from pagedkv.deployment import check_model_limit
    from pagedkv.models import describe_model
    from pagedkv.sim.setup import setup_from_model

    layout = describe_model(source)
    if check_model_limit(layout, cache.max_model_len):
        warn_long(layout, cache.max_model_len)
    return setup_from_model(
        source,  # type: ignore[arg-type]
        num_blocks=num_blocks,
        tensor_parallel_size=cache.tensor_parallel_size,
        pipeline_parallel_size=cache.pipeline_parallel_size,
        block_size=cache.block_size,
        max_model_len=cache.max_model_len,
        kv_cache_dtype=cache.kv_cache_dtype,
    )


def _planned_setup(
    source: ModelSource,
    gpu: str | None,
    cache: CacheOptions,
    scheduler_flags: tuple[int | None, int | None],
    warn_long: LongModelWarning,
) -> SimSetup:
    from pagedkv.deployment import PlanRequest, VLLMFlags
    from pagedkv.sim.setup import setup_from_request

    max_num_seqs, max_num_batched_tokens = scheduler_flags
    flags = VLLMFlags(
        max_model_len=cache.max_model_len,
        block_size=cache.block_size,
        kv_cache_dtype=cache.kv_cache_dtype,
        # As `pagedkv plan`: vLLM's defaults for the GPU unless given on the line.
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
    )
    request = PlanRequest(
        model=source,
        gpu=gpu,
        tensor_parallel_size=cache.tensor_parallel_size,
        pipeline_parallel_size=cache.pipeline_parallel_size,
        flags=flags,
    )
    setup, result = setup_from_request(request)
    if result.above_model_limit:
        warn_long(result.layout, cache.max_model_len)
    return setup
