"""``pagedkv.plan``: plan a model's KV cache on given GPUs with given vLLM flags.

The one place that turns a model, a device and flags into a plan: the CLI's ``plan``
and ``simulate``, the simulator's ``setup_from_model`` and a notebook all call it, so
they agree on every default and every number.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Unpack

from pagedkv.capacity.plan import plan_kv_cache
from pagedkv.config import EngineConfig, ModelConfig
from pagedkv.deployment.format import format_bytes
from pagedkv.deployment.options import (
    DEFAULT_GPU,
    PlanRequest,
    VLLMFlagArgs,
    vllm_flags_from,
    vllm_scheduler_defaults,
)
from pagedkv.deployment.report import DeploymentPlan
from pagedkv.deployment.startup import parse_speculative_config, startup_options, with_dtype
from pagedkv.errors import ConfigError, InsufficientMemoryError
from pagedkv.models import (
    GPU,
    MemoryBudget,
    ModelLayout,
    describe_model,
    engine_config_for,
    get_gpu,
    get_kv_cache_specs,
    load_model_config,
    memory_budgets,
)
from pagedkv.models.gdn_kernel import gdn_key_head_dim, gdn_prefill_kernel
from pagedkv.models.gpus import LOCAL
from pagedkv.models.profile_shape import ProfileShape, profile_shape
from pagedkv.models.source import ModelLike

__all__ = ["ALLOW_LONG_ENV", "DEFAULT_CONTEXT_LENGTHS", "check_model_limit", "plan", "plan_model"]

# Context lengths the concurrency table shows besides max_model_len (those below it).
DEFAULT_CONTEXT_LENGTHS = (1024, 4096, 16384, 65536)
ALLOW_LONG_ENV = "PAGEDKV_ALLOW_LONG_MAX_MODEL_LEN"


def plan(
    model: ModelLike | ModelLayout,
    gpu: str | GPU | None = None,
    tensor_parallel_size: int = 1,
    pipeline_parallel_size: int = 1,
    *,
    memory_bytes: int | None = None,
    weight_bytes: int | None = None,
    grouping: str = "vllm",
    max_kv_cache_groups: int | None = None,
    context_lengths: tuple[int, ...] = (),
    revision: str | None = None,
    vllm_version: str | None = None,
    **vllm_flags: Unpack[VLLMFlagArgs],
) -> DeploymentPlan:
    """Plan ``model``'s KV cache on ``gpu`` x TP x PP with ``vllm serve``'s flags.

    Args:
        model: bundled name, directory, config.json, Hub id (``org/name``) or ModelSource.
        gpu: a GPU from ``pagedkv.list_gpus()`` (default H100-80GB unless
            ``memory_bytes`` or ``kv_cache_memory_bytes`` gives the budget).
        tensor_parallel_size: workers each stage's layers are split over (vLLM's flag).
        pipeline_parallel_size: stages the layers are split into (vLLM's flag).
        memory_bytes: device memory per worker instead of a GPU.
        weight_bytes: weights per worker (default: estimated from the config).
        grouping: ``"vllm"`` (vLLM 0.33's rule, default) or ``"least-waste"``.
        max_kv_cache_groups: most groups ``least-waste`` may choose.
        context_lengths: extra lengths for the concurrency table.
        revision: Hub revision of the config.
        vllm_version: account start-up memory as this vLLM release did (None: 0.33).
        **vllm_flags: ``VLLMFlags`` by name (``max_model_len=32768``, ``max_num_seqs=64``,
            ``kv_cache_dtype="fp8"``, ...); unset flags take vLLM's defaults.

    Returns the DeploymentPlan ``pagedkv plan`` prints.
    """
    request = PlanRequest(
        model=model,
        gpu=gpu,
        memory_bytes=memory_bytes,
        tensor_parallel_size=tensor_parallel_size,
        pipeline_parallel_size=pipeline_parallel_size,
        flags=vllm_flags_from(vllm_flags),
        weight_bytes=weight_bytes,
        grouping=grouping,
        max_kv_cache_groups=max_kv_cache_groups,
        context_lengths=tuple(context_lengths),
        revision=revision,
        vllm_version=vllm_version,
    )
    return plan_model(request)


def _layout(request: PlanRequest) -> tuple[ModelLayout, ProfileShape | None]:
    """The layout in ``--dtype`` and the shape vLLM profiles start-up memory with
    (None for a ModelLayout given directly: the layout's own shape)."""
    if isinstance(request.model, ModelLayout):
        return with_dtype(request.model, request.flags.dtype), None
    source = load_model_config(request.model, revision=request.revision)
    layout = with_dtype(describe_model(source), request.flags.dtype)
    return layout, profile_shape(layout, source)


def _device(request: PlanRequest) -> tuple[GPU | None, int | None]:
    if request.gpu is not None and request.memory_bytes is not None:
        raise ConfigError("--gpu and --memory are alternatives; give one")
    if request.memory_bytes is not None:
        return None, request.memory_bytes
    if request.gpu is not None or request.flags.kv_cache_memory_bytes is None:
        gpu = request.gpu if isinstance(request.gpu, GPU) else get_gpu(request.gpu or DEFAULT_GPU)
        return gpu, gpu.planning_memory_bytes
    return None, None


def engine_options(
    request: PlanRequest, gpu: GPU | None, device_bytes: int | None
) -> dict[str, Any]:
    """EngineConfig options for the request: its flags, vLLM's defaults for the rest."""
    flags = request.flags
    # vLLM reads the device's total memory (as CUDA reports it) for these defaults;
    # for --gpu local the plan's figure is the free memory, the total is the GPU's.
    total = gpu.memory_bytes if gpu is not None and gpu.vendor == LOCAL else device_bytes
    seqs, tokens = vllm_scheduler_defaults(total, gpu.name if gpu else "")
    options: dict[str, Any] = {
        "tensor_parallel_size": request.tensor_parallel_size,
        "pipeline_parallel_size": request.pipeline_parallel_size,
        "block_size": flags.block_size,
        "cache_dtype": flags.kv_cache_dtype,
        "gpu_memory_utilization": flags.gpu_memory_utilization,
        "max_num_seqs": flags.max_num_seqs or seqs,
        "max_num_batched_tokens": flags.max_num_batched_tokens or tokens,
        "num_gpu_blocks_override": flags.num_gpu_blocks_override,
        "kv_cache_grouping_rule": request.grouping,
    }
    if flags.enable_prefix_caching is not None:
        options["enable_prefix_caching"] = flags.enable_prefix_caching
    if flags.max_model_len is not None:
        options["max_model_len"] = flags.max_model_len
    if request.max_kv_cache_groups is not None:
        options["max_kv_cache_groups"] = request.max_kv_cache_groups
    if flags.kv_cache_layout is not None:
        options["kv_cache_layout"] = flags.kv_cache_layout
    return options | speculative_options(flags.speculative_config)


def speculative_options(text: str | None) -> dict[str, Any]:
    """EngineConfig options for ``--speculative-config``: the method and its tokens (the
    EAGLE groups and prefill lookahead follow; plan_model adds the model's MTP modules)."""
    speculative = parse_speculative_config(text)
    method = speculative.get("method")
    if not isinstance(method, str) or not method:
        return {}
    tokens = speculative.get("num_speculative_tokens", 0)
    return {
        "speculative_method": method,
        "num_speculative_tokens": tokens if isinstance(tokens, int) and tokens > 0 else 0,
        "disable_eagle_block_drop": speculative.get("disable_eagle_block_drop") is True,
    }


def allow_long_max_model_len() -> bool:
    return os.environ.get(ALLOW_LONG_ENV, "").strip().lower() in ("1", "true", "yes")


def check_model_limit(layout: ModelLayout, max_model_len: int | None) -> bool:
    """vLLM refuses a max_model_len above what the model was trained for; so do we,
    unless ``PAGEDKV_ALLOW_LONG_MAX_MODEL_LEN`` is set (then True: the caller warns)."""
    limit = layout.max_model_len
    if max_model_len in (None, -1) or not limit or max_model_len <= limit:
        return False
    if allow_long_max_model_len():
        return True
    raise ConfigError(
        f"--max-model-len {max_model_len:,} is above {layout.name}'s limit of {limit:,} "
        f"tokens (its position embeddings); set {ALLOW_LONG_ENV}=1 to plan it anyway, as "
        "vLLM's VLLM_ALLOW_LONG_MAX_MODEL_LEN does"
    )


def check_budgets(budgets: list[MemoryBudget]) -> None:
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


def model_limit(layout: ModelLayout, config: EngineConfig) -> int:
    """The longest max_model_len an auto-fit searches: the model's limit (or the length
    asked for, if larger); a model without one (pure Mamba) the EngineConfig default."""
    return max(layout.max_model_len or ModelConfig().max_model_len, config.max_model_len)


def plan_model(request: PlanRequest) -> DeploymentPlan:
    """Read the model, size each worker's memory budget, and ask the planner once."""
    layout, shape = _layout(request)
    above_limit = check_model_limit(layout, request.flags.max_model_len)
    gpu, device_bytes = _device(request)
    options = engine_options(request, gpu, device_bytes)
    if shape is not None and "speculative_method" in options:
        options["num_draft_modules"] = max(1, shape.mtp_layers)
    if gpu is not None:
        options["gdn_prefill_kernel"] = gdn_prefill_kernel(gpu, gdn_key_head_dim(layout))
    config = engine_config_for(layout, **options)
    budgets = memory_budgets(
        layout,
        config,
        device_bytes=device_bytes,
        weight_bytes=request.weight_bytes,
        kv_cache_bytes=request.flags.kv_cache_memory_bytes,
        shape=shape,
        options=startup_options(gpu, request.flags, request.vllm_version),
    )
    check_budgets(budgets)
    specs = tuple(get_kv_cache_specs(layout, config=config))
    limit = model_limit(layout, config)
    # One planning pass: with max_model_len=-1 the length is known only afterwards, so
    # default context lengths at or above the fitted one are dropped from the table.
    target = config.max_model_len if config.max_model_len > 0 else limit
    kv_plan = plan_kv_cache(
        config,
        specs,
        [b.kv_cache_bytes for b in budgets],
        context_lengths=_context_lengths(request, target),
        max_model_len_limit=limit,
    )
    points = tuple(
        p
        for p in kv_plan.max_concurrency
        if p.context_len <= kv_plan.max_model_len or p.context_len in request.context_lengths
    )
    kv_plan = dataclasses.replace(kv_plan, max_concurrency=points)
    return DeploymentPlan(
        layout=layout,
        config=config,
        gpu=gpu,
        budgets=tuple(budgets),
        kv_cache=kv_plan,
        largest_max_model_len=kv_plan.largest_max_model_len,
        model_limit=limit,
        kv_cache_specs=specs,
        above_model_limit=above_limit,
    )
