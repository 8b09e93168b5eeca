"""``pagedkv plan``: how a model's KV cache is laid out on given GPUs, and what fits.

The command reads the model, sizes each worker's memory budget and asks the planner
once; ``plan_render`` prints the result.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path

import typer

from pagedkv.capacity import plan_kv_cache
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
    check_output_dir,
    format_bytes,
    parse_bytes,
    parse_max_model_len,
    stderr_console,
    vllm_scheduler_defaults,
)
from pagedkv.cli.plan_render import PlanResult
from pagedkv.config import ModelConfig
from pagedkv.errors import ConfigError, InsufficientMemoryError, PlanningError
from pagedkv.models import (
    GPU,
    MemoryBudget,
    ModelLayout,
    ModelSource,
    describe_model,
    engine_config_for,
    get_gpu,
    get_kv_cache_specs,
    load_model_config,
    memory_budgets,
)

# A 5:1 sliding-window hybrid on the most common serving GPU: its plan shows hybrid
# grouping (vLLM's rule pads 8 layer slots here; --grouping least-waste shows what the
# search weighed) and how concurrency collapses from 1K to 128K contexts, on one screen.
DEFAULT_MODEL = "gemma-3-27b-it"
DEFAULT_CONTEXT_LENGTHS = (1024, 4096, 16384, 65536)


@dataclass(frozen=True)
class PlanRequest:
    model: str | ModelSource
    gpu: str | None = None
    memory: str | None = None
    gpu_memory_utilization: float = 0.9
    weights: str = "auto"
    kv_cache_memory: str | None = None
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    max_model_len: int | None = None
    block_size: int = 16
    kv_cache_dtype: str = "auto"
    context_lengths: tuple[int, ...] = ()
    max_groups: int | None = None
    grouping: str = "vllm"
    # None: vLLM's `vllm serve` default for the device.
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    enable_prefix_caching: bool | None = None
    num_gpu_blocks_override: int | None = None
    prefix_caching_hash_algo: str = "sha256"
    revision: str | None = None
    # None: the platform's layout (layer-outermost NHD on the generic platform).
    kv_cache_layout: str | None = None


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
KV_CACHE_LAYOUT_OPTION = typer.Option(
    None,
    "--kv-cache-layout",
    help="Physical KV cache layout, as vLLM's VLLM_KV_CACHE_LAYOUT (LBNHC, BLNHC, ...); "
    "block-outermost ones (B first) pack groups of different page sizes.",
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
    kv_cache_layout: str | None = KV_CACHE_LAYOUT_OPTION,
    json_output: bool = JSON_OPTION,
    plot: Path | None = PLOT_OPTION,
) -> None:
    """Plan the KV cache of MODEL on a GPU: groups, blocks, capacity, waste."""
    from pagedkv.cli.plan_render import print_json, print_tables, write_plot
    from pagedkv.cli.progress import require_matplotlib

    if plot is not None:
        require_matplotlib()
        check_output_dir("--plot", plot)
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
        kv_cache_layout=kv_cache_layout,
    )
    result = make_plan(request)
    if plot is not None:
        write_plot(result, plot)
    if json_output:
        print_json(result)
    else:
        print_tables(result, plot)


def _device(request: PlanRequest) -> tuple[GPU | None, int | None]:
    if request.gpu and request.memory:
        raise ConfigError("--gpu and --memory are alternatives; give one")
    if request.memory:
        return None, parse_bytes(request.memory, "--memory")
    if request.gpu or not request.kv_cache_memory:
        gpu = get_gpu(request.gpu or DEFAULT_GPU)
        return gpu, gpu.planning_memory_bytes
    return None, None


def _check_budgets(budgets: list[MemoryBudget]) -> None:
    for worker, b in enumerate(budgets):
        if b.kv_cache_bytes > 0:
            continue
        raise InsufficientMemoryError(
            f"no memory left for the KV cache on worker {worker}: {format_bytes(b.usable_bytes)} "
            f"usable ({format_bytes(b.device_bytes)} x {b.gpu_memory_utilization}) - "
            f"{format_bytes(b.weight_bytes)} weights - {format_bytes(b.activation_bytes)} "
            "activation reserve; use more GPUs (-tp/-pp), a larger --memory or "
            "--gpu-memory-utilization, or give --kv-cache-memory-bytes"
        )


def _context_lengths(request: PlanRequest, max_model_len: int) -> list[int]:
    picked = [n for n in DEFAULT_CONTEXT_LENGTHS if n < max_model_len]
    return sorted(set(picked) | set(request.context_lengths))


def _options(request: PlanRequest, gpu: GPU | None, device_bytes: int | None) -> dict[str, object]:
    # vLLM reads the device's total memory for these defaults.
    total = max(device_bytes or 0, gpu.memory_bytes if gpu else 0)
    seqs, tokens = vllm_scheduler_defaults(total, gpu.name if gpu else "")
    options: dict[str, object] = {
        "tensor_parallel_size": request.tensor_parallel_size,
        "pipeline_parallel_size": request.pipeline_parallel_size,
        "block_size": request.block_size,
        "cache_dtype": request.kv_cache_dtype,
        "gpu_memory_utilization": request.gpu_memory_utilization,
        "max_num_seqs": request.max_num_seqs or seqs,
        "max_num_batched_tokens": request.max_num_batched_tokens or tokens,
        "num_gpu_blocks_override": request.num_gpu_blocks_override,
    }
    if request.enable_prefix_caching is not None:
        options["enable_prefix_caching"] = request.enable_prefix_caching
    if request.max_model_len is not None:
        options["max_model_len"] = request.max_model_len
    if request.max_groups is not None:
        options["max_kv_cache_groups"] = request.max_groups
    options["kv_cache_grouping_rule"] = request.grouping
    if request.kv_cache_layout is not None:
        options["kv_cache_layout"] = request.kv_cache_layout
    return options


ALLOW_LONG_ENV = "PAGEDKV_ALLOW_LONG_MAX_MODEL_LEN"


def check_model_limit(layout: ModelLayout, max_model_len: int | None) -> None:
    """vLLM refuses a max_model_len above what the model was trained for; so do we."""
    limit = layout.max_model_len
    if max_model_len in (None, -1) or not limit or max_model_len <= limit:
        return
    if os.environ.get(ALLOW_LONG_ENV, "").strip().lower() in ("1", "true", "yes"):
        stderr_console().print(
            f"warning: --max-model-len {max_model_len:,} is above {layout.name}'s limit "
            f"{limit:,}; planning it because {ALLOW_LONG_ENV} is set",
            markup=False,
        )
        return
    raise ConfigError(
        f"--max-model-len {max_model_len:,} is above {layout.name}'s limit of {limit:,} "
        f"tokens (its position embeddings); set {ALLOW_LONG_ENV}=1 to plan it anyway, as "
        "vLLM's VLLM_ALLOW_LONG_MAX_MODEL_LEN does"
    )


def make_plan(request: PlanRequest) -> PlanResult:
    """Read the model, size the memory budget, and ask the planner."""
    layout = describe_model(load_model_config(request.model, revision=request.revision))
    check_model_limit(layout, request.max_model_len)
    gpu, device_bytes = _device(request)
    config = engine_config_for(layout, **_options(request, gpu, device_bytes))
    weights = None if request.weights == "auto" else parse_bytes(request.weights, "--weights")
    kv_memory = request.kv_cache_memory
    kv_bytes = parse_bytes(kv_memory, "--kv-cache-memory-bytes") if kv_memory else None
    budgets = memory_budgets(
        layout, config, device_bytes=device_bytes, weight_bytes=weights, kv_cache_bytes=kv_bytes
    )
    _check_budgets(budgets)
    specs = tuple(get_kv_cache_specs(layout, config=config))
    available = [b.kv_cache_bytes for b in budgets]
    # Auto-fit searches up to the model's limit (or the length asked for, if larger);
    # a model without a limit (pure Mamba) searches up to the EngineConfig default.
    limit = max(layout.max_model_len or ModelConfig().max_model_len, config.max_model_len)
    # One planning pass: with max_model_len=-1 the length is known only afterwards, so
    # default context lengths at or above the fitted one are dropped from the table.
    target = config.max_model_len if config.max_model_len > 0 else limit
    lengths = _context_lengths(request, target)
    plan = plan_kv_cache(
        config, specs, available, context_lengths=lengths, max_model_len_limit=limit
    )
    points = tuple(
        p
        for p in plan.max_concurrency
        if p.context_len <= plan.max_model_len or p.context_len in request.context_lengths
    )
    plan = dataclasses.replace(plan, max_concurrency=points)
    largest = plan.largest_max_model_len
    return PlanResult(layout, config, gpu, tuple(budgets), plan, largest, limit, specs)


__all__ = [
    "DEFAULT_GPU",
    "DEFAULT_MODEL",
    "PlanRequest",
    "PlanResult",
    "PlanningError",
    "make_plan",
]
