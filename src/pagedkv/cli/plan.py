"""``pagedkv plan``: how a model's KV cache is laid out on given GPUs, and what fits."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import typer

from pagedkv.cli.common import (
    BLOCK_SIZE_OPTION,
    DEFAULT_GPU,
    JSON_OPTION,
    PP_OPTION,
    TP_OPTION,
    format_bytes,
    parse_bytes,
)
from pagedkv.config import EngineConfig, ModelConfig
from pagedkv.errors import ConfigError, InsufficientMemoryError, PlanningError
from pagedkv.models import (
    GPU,
    MemoryBudget,
    ModelLayout,
    describe_model,
    engine_config_for,
    get_gpu,
    get_kv_cache_specs,
    memory_budgets,
)
from pagedkv.planning import KVCachePlan, plan_kv_cache
from pagedkv.specs import KVCacheSpec

# A 5:1 sliding-window hybrid on the most common serving GPU: its plan shows hybrid
# grouping (vLLM's rule pads 8 layer slots here; --grouping least-waste shows what the
# search weighed) and how concurrency collapses from 4K to 128K contexts, on one screen.
DEFAULT_MODEL = "gemma-3-27b-it"
DEFAULT_CONTEXT_LENGTHS = (1024, 4096, 16384, 65536)


@dataclass(frozen=True)
class PlanRequest:
    model: str
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


@dataclass(frozen=True)
class PlanResult:
    """What ``plan`` prints: the planner's plan plus the inputs it was given."""

    layout: ModelLayout
    config: EngineConfig
    gpu: GPU | None
    budgets: tuple[MemoryBudget, ...]
    plan: KVCachePlan
    largest_max_model_len: int
    model_limit: int
    kv_cache_specs: tuple[dict[str, KVCacheSpec], ...]


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
            "activation reserve; use more GPUs (--tp/--pp), a larger --memory or "
            "--gpu-memory-utilization, or give --kv-cache-memory"
        )


def _context_lengths(request: PlanRequest, max_model_len: int) -> list[int]:
    picked = [n for n in DEFAULT_CONTEXT_LENGTHS if n < max_model_len]
    return sorted(set(picked) | set(request.context_lengths))


def make_plan(request: PlanRequest) -> PlanResult:
    """Read the model, size the memory budget, and ask the planner."""
    layout = describe_model(request.model)
    gpu, device_bytes = _device(request)
    options: dict[str, object] = {
        "tensor_parallel_size": request.tensor_parallel_size,
        "pipeline_parallel_size": request.pipeline_parallel_size,
        "block_size": request.block_size,
        "cache_dtype": request.kv_cache_dtype,
        "gpu_memory_utilization": request.gpu_memory_utilization,
    }
    if request.max_model_len is not None:
        options["max_model_len"] = request.max_model_len
    if request.max_groups is not None:
        options["max_kv_cache_groups"] = request.max_groups
    options["kv_cache_grouping_rule"] = request.grouping
    config = engine_config_for(layout, **options)
    weights = None if request.weights == "auto" else parse_bytes(request.weights, "--weights")
    kv_memory = request.kv_cache_memory
    kv_bytes = parse_bytes(kv_memory, "--kv-cache-memory") if kv_memory else None
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
        DEFAULT_MODEL, help="Bundled model name, model directory or config.json."
    ),
    gpu: str | None = typer.Option(
        None, "--gpu", help=f"GPU from the table (default {DEFAULT_GPU})."
    ),
    memory: str | None = typer.Option(None, "--memory", help="Device memory, e.g. 80GiB."),
    gpu_memory_utilization: float = typer.Option(
        0.9, "--gpu-memory-utilization", help="Share of device memory the engine may use."
    ),
    weights: str = typer.Option("auto", "--weights", help="Weight bytes per worker, or auto."),
    kv_cache_memory: str | None = typer.Option(
        None, "--kv-cache-memory", help="KV cache bytes per worker (skips the estimate)."
    ),
    tp: int = TP_OPTION,
    pp: int = PP_OPTION,
    max_model_len: int | None = typer.Option(
        None,
        "--max-model-len",
        help="Tokens per request (default: the model's); -1 fits the largest.",
    ),
    block_size: int = BLOCK_SIZE_OPTION,
    kv_cache_dtype: str = typer.Option(
        "auto", "--kv-cache-dtype", help="bfloat16, fp8, int8_per_token_head, ... (auto: model's)."
    ),
    context_len: list[int] = CONTEXT_LEN_OPTION,
    max_groups: int | None = MAX_GROUPS_OPTION,
    grouping: str = GROUPING_OPTION,
    json_output: bool = JSON_OPTION,
    plot: Path | None = PLOT_OPTION,
) -> None:
    """Plan the KV cache of MODEL on a GPU: groups, blocks, capacity, waste."""
    from pagedkv.cli.plan_render import print_json, print_tables, write_plot

    request = PlanRequest(
        model=model,
        gpu=gpu,
        memory=memory,
        gpu_memory_utilization=gpu_memory_utilization,
        weights=weights,
        kv_cache_memory=kv_cache_memory,
        tensor_parallel_size=tp,
        pipeline_parallel_size=pp,
        max_model_len=max_model_len,
        block_size=block_size,
        kv_cache_dtype=kv_cache_dtype,
        context_lengths=tuple(context_len),
        max_groups=max_groups,
        grouping=grouping,
    )
    result = make_plan(request)
    if plot is not None:
        write_plot(result, plot)
    if json_output:
        print_json(result)
    else:
        print_tables(result, plot)


__all__ = ["PlanningError", "PlanRequest", "PlanResult", "make_plan"]
