"""``pagedkv plan``: how a model's KV cache is laid out on given GPUs, and what fits."""

from __future__ import annotations

from pathlib import Path

import typer

from pagedkv.cli.common import (
    BLOCK_SIZE_OPTION,
    DEFAULT_GPU,
    JSON_OPTION,
    KV_CACHE_DTYPE_OPTION,
    MAX_MODEL_LEN_OPTION,
    PLATFORM_OPTION,
    PP_OPTION,
    PREFIX_CACHING_OPTION,
    REVISION_OPTION,
    TP_OPTION,
    check_hash_algo,
    parse_max_model_len,
)
from pagedkv.cli.plan_request import DEFAULT_MODEL, PlanRequest, PlanResult, make_plan
from pagedkv.errors import ConfigError, PlanningError

CONTEXT_LEN_OPTION = typer.Option(
    [], "--context-len", help="Extra context length for the concurrency table (repeatable)."
)
MAX_GROUPS_OPTION = typer.Option(
    None,
    "--max-groups",
    min=1,
    help="Most KV cache groups --grouping least-waste may choose (default 16); "
    "fewer groups cost less run time per call, more may waste less memory.",
)
GROUPING_OPTION = typer.Option(
    "vllm",
    "--grouping",
    help="How layers form KV cache groups: vllm (vLLM 0.33's rule) or least-waste "
    "(pagedkv's search for the fewest bytes per request).",
)
PLOT_OPTION = typer.Option(
    None, "--plot", help="Write max concurrency vs context length (PNG, needs matplotlib)."
)


def plan_command(
    model: str = typer.Argument(
        DEFAULT_MODEL, help="Hugging Face model id, bundled model name, directory or config.json."
    ),
    gpu: str | None = typer.Option(
        None, "--gpu", help=f"GPU from `pagedkv gpus`, or local[:N] (default {DEFAULT_GPU})."
    ),
    memory: str | None = typer.Option(None, "--memory", help="Device memory, e.g. 80GiB."),
    gpu_memory_utilization: float = typer.Option(
        0.9, "--gpu-memory-utilization", help="Share of device memory the engine may use."
    ),
    weights: str = typer.Option("auto", "--weights", help="Weight bytes per worker, or auto."),
    kv_cache_memory: str | None = typer.Option(
        None,
        "--kv-cache-memory-bytes",
        "--kv-cache-memory",
        help="KV cache bytes per worker, e.g. 40GiB or 40G (skips the estimate).",
    ),
    num_gpu_blocks_override: int | None = typer.Option(
        None, "--num-gpu-blocks-override", min=1, help="Blocks per worker (as vLLM's)."
    ),
    tp: int = TP_OPTION,
    pp: int = PP_OPTION,
    max_model_len: str | None = MAX_MODEL_LEN_OPTION,
    block_size: int = BLOCK_SIZE_OPTION,
    kv_cache_dtype: str = KV_CACHE_DTYPE_OPTION,
    max_num_seqs: int | None = typer.Option(
        None, "--max-num-seqs", min=1, help="Requests per step (default: vLLM's for the GPU)."
    ),
    max_num_batched_tokens: int | None = typer.Option(
        None,
        "--max-num-batched-tokens",
        min=1,
        help="Tokens per step (default: vLLM's for the GPU); sizes the activation reserve.",
    ),
    enable_prefix_caching: bool | None = PREFIX_CACHING_OPTION,
    prefix_caching_hash_algo: str = typer.Option(
        "sha256",
        "--prefix-caching-hash-algo",
        callback=check_hash_algo,
        help="Accepted for vLLM command lines; it does not change a plan.",
    ),
    revision: str | None = REVISION_OPTION,
    platform: str | None = PLATFORM_OPTION,
    context_len: list[int] = CONTEXT_LEN_OPTION,
    max_groups: int | None = MAX_GROUPS_OPTION,
    grouping: str = GROUPING_OPTION,
    json_output: bool = JSON_OPTION,
    plot: Path | None = PLOT_OPTION,
) -> None:
    """Plan the KV cache of MODEL on a GPU: groups, blocks, capacity, waste."""
    from pagedkv.cli.plan_render import print_json, print_tables, write_plot
    from pagedkv.cli.progress import require_matplotlib

    if plot is not None:
        require_matplotlib()
        if not plot.expanduser().parent.is_dir():
            raise ConfigError(f"--plot: directory {str(plot.parent)!r} does not exist")
    request = PlanRequest(
        model=model,
        gpu=gpu,
        memory=memory,
        gpu_memory_utilization=gpu_memory_utilization,
        weights=weights,
        kv_cache_memory=kv_cache_memory,
        tensor_parallel_size=tp,
        pipeline_parallel_size=pp,
        max_model_len=parse_max_model_len(max_model_len),
        block_size=block_size,
        kv_cache_dtype=kv_cache_dtype,
        context_lengths=tuple(context_len),
        max_groups=max_groups,
        grouping=grouping,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        enable_prefix_caching=enable_prefix_caching,
        num_gpu_blocks_override=num_gpu_blocks_override,
        prefix_caching_hash_algo=prefix_caching_hash_algo,
        revision=revision,
    )
    result = make_plan(request)
    if plot is not None:
        write_plot(result, plot)
    if json_output:
        print_json(result)
    else:
        print_tables(result, plot)


__all__ = [
    "DEFAULT_GPU",
    "DEFAULT_MODEL",
    "PlanRequest",
    "PlanResult",
    "PlanningError",
    "make_plan",
]
