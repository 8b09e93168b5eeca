"""What an engine's workers get from a model: each one's ``{layer name: KVCacheSpec}``
(pipeline stages x tensor-parallel ranks), the EngineConfig, and each one's memory
(weights, activation reserve, KV cache budget)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from pagedkv.config import CacheConfig, EngineConfig
from pagedkv.dtypes import canonical_dtype_name, dtype_size
from pagedkv.errors import ConfigError, ModelConfigError
from pagedkv.models.adapters import describe_model
from pagedkv.models.layers import ModelLayout, Unit, layer_spec
from pagedkv.models.profile_shape import (
    BytesPerParam,
    ProfileShape,
    WeightFormat,
    online_weight_format,
    profile_shape,
    weight_format,
)
from pagedkv.models.source import ModelLike
from pagedkv.models.startup_memory import MemoryTerm, StartupOptions, profile_terms, reserve_bytes
from pagedkv.specs import KVCacheSpec

__all__ = [
    "engine_config_for",
    "bytes_per_param",
    "weight_bytes_per_worker",
    "estimate_weight_bytes",
    "startup_terms",
    "activation_reserve_bytes",
    "MemoryBudget",
    "memory_budgets",
    "pipeline_stages",
    "get_kv_cache_specs",
]

if TYPE_CHECKING:
    from pagedkv.config import MambaCacheMode


def _as_layout(model: ModelLike | ModelLayout, use_transformers: bool | None) -> ModelLayout:
    if isinstance(model, ModelLayout):
        return model
    return describe_model(model, use_transformers=use_transformers)


def engine_config_for(model: ModelLike | ModelLayout, **options: Any) -> EngineConfig:
    """An EngineConfig for the model: its name, dtype and length limit, then ``options``.

    Encoder-decoder models get ``max_num_encoder_input_tokens`` from the config and
    prefix caching off (cross attention cannot be cached). A model without a length
    limit keeps the EngineConfig default.
    """
    layout = _as_layout(model, None)
    base: dict[str, Any] = {"name": layout.name, "dtype": layout.dtype}
    if layout.max_model_len:
        base["max_model_len"] = layout.max_model_len
    if layout.max_encoder_len:
        base["max_num_encoder_input_tokens"] = layout.max_encoder_len
        base["enable_prefix_caching"] = False
    return EngineConfig.create(**{**base, **options})


def _stored_format(layout: ModelLayout, shape: ProfileShape | None) -> WeightFormat:
    if shape is not None:
        return shape.weights
    if layout.quant_method:
        try:
            return weight_format({"quant_method": layout.quant_method}, layout.name)
        except ModelConfigError:
            return WeightFormat(f"{layout.quant_method} (unsized: model dtype assumed)")
    return WeightFormat("model dtype")


def bytes_per_param(layout: ModelLayout, fmt: WeightFormat | None = None) -> BytesPerParam:
    """Bytes per dense linear and per expert parameter as the checkpoint stores them."""
    return (fmt or _stored_format(layout, None)).bytes_per_param(layout.dtype)


def _extra_first_stage(layout: ModelLayout, shape: ProfileShape | None, dense: float) -> float:
    """Encoder towers the adapters did not count (vision, audio) sit with the embedding."""
    if layout.encoder_params or shape is None:
        return layout.encoder_params * dense
    return sum(enc.params for enc in shape.encoders) * float(dtype_size(layout.dtype))


def _mtp_bytes(
    layout: ModelLayout,
    shape: ProfileShape | None,
    options: StartupOptions | None,
    dense: float,
    expert: float,
) -> float:
    """Multi-token-prediction layers load only when speculative decoding uses them."""
    if (
        shape is None
        or options is None
        or options.speculative_method not in ("mtp", "deepseek_mtp")
    ):
        return 0.0
    last = layout.units[-1] if layout.units else None
    if last is None:
        return 0.0
    return shape.mtp_layers * (last.params * dense + last.expert_params * expert)


def weight_bytes_per_worker(
    model: ModelLike | ModelLayout,
    tensor_parallel_size: int = 1,
    pipeline_parallel_size: int = 1,
    *,
    shape: ProfileShape | None = None,
    options: StartupOptions | None = None,
) -> list[int]:
    """Estimated weight bytes on each worker (pp-major), as the checkpoint stores them.

    Every stage holds its layers, the first also the embedding and encoder towers,
    the last the output head (and MTP layers when speculative decoding loads them);
    tensor parallelism divides each stage evenly, expert parallelism divides the
    experts over ``tp x dp`` ranks. Norms and biases are not counted, unless the
    checkpoint's index states its total size: then the split is scaled to that
    total. ``--cpu-offload-gb`` takes up to that many bytes off every worker.

    Args:
        model: bundled name, directory, config.json, Hub id, ModelSource or ModelLayout.
        tensor_parallel_size: workers each stage is split over.
        pipeline_parallel_size: stages the layers are split into.
        shape: the profiling shape, for MoE and MTP sizes (None: the layout alone).
        options: the vLLM flags (quantization, expert parallelism, CPU offload; None: vLLM's
            defaults).
    """
    layout = _as_layout(model, None)
    tp, pp = tensor_parallel_size, pipeline_parallel_size
    fmt = _stored_format(layout, shape)
    if options is not None:
        fmt = online_weight_format(options.quantization, fmt)
    dense, expert = bytes_per_param(layout, fmt)
    base = dtype_size(layout.dtype)
    expert_ranks = (
        tp * options.data_parallel_size if options and options.enable_expert_parallel else tp
    )
    if shape is not None and shape.num_experts:
        per_rank = shape.moe_intermediate_size // (1 if expert_ranks != tp else tp)
        expert *= fmt.expert_scale(layout.hidden_size, per_rank)
    out: list[int] = []
    stages = pipeline_stages(layout, pp)
    for rank, units in enumerate(stages):
        shared = sum(u.params * dense for u in units)
        experts = sum(u.expert_params * expert for u in units)
        if rank == 0:
            shared += layout.embedding_params * base + _extra_first_stage(layout, shape, dense)
        if rank == len(stages) - 1:
            shared += layout.head_params * base + _mtp_bytes(layout, shape, options, dense, expert)
        out.extend([int(-(-(shared / tp + experts / expert_ranks) // 1))] * tp)
    estimated = sum(out)
    if layout.checkpoint_bytes and estimated and fmt.label == _stored_format(layout, shape).label:
        scale = layout.checkpoint_bytes / estimated
        out = [int(-(-(w * scale) // 1)) for w in out]
    offload = options.cpu_offload_bytes if options else 0
    return [max(w - offload, 0) for w in out]


def estimate_weight_bytes(
    model: ModelLike | ModelLayout, tensor_parallel_size: int = 1, pipeline_parallel_size: int = 1
) -> int:
    """Weight bytes of the most loaded worker (what its memory budget must hold)."""
    return max(weight_bytes_per_worker(model, tensor_parallel_size, pipeline_parallel_size))


def startup_terms(
    layout: ModelLayout,
    config: EngineConfig,
    shape: ProfileShape | None = None,
    options: StartupOptions | None = None,
) -> list[MemoryTerm]:
    """The non-weight terms vLLM subtracts at start-up, per worker (models.startup_memory).

    Args:
        layout: the model's layout.
        config: the engine config (parallel sizes, batch limits).
        shape: the profiling shape (None: taken from ``layout``).
        options: the vLLM flags (None: vLLM 0.33's defaults).
    """
    return profile_terms(
        layout, shape or profile_shape(layout), config, options or StartupOptions()
    )


def activation_reserve_bytes(
    layout: ModelLayout,
    config: EngineConfig,
    shape: ProfileShape | None = None,
    options: StartupOptions | None = None,
) -> int:
    """Everything but the weights that vLLM 0.33 takes before the KV cache, per worker:
    non-torch memory, the profile peak and the CUDA graph estimate.

    Args:
        layout: the model's layout.
        config: the engine config (parallel sizes, batch limits).
        shape: the profiling shape (None: taken from ``layout``).
        options: the vLLM flags (None: vLLM 0.33's defaults).
    """
    return reserve_bytes(startup_terms(layout, config, shape, options))


@dataclass(frozen=True)
class MemoryBudget:
    """KV cache memory of one worker: ``ceil(device x utilization) - weights - reserve``.

    ``kv_cache_bytes`` is the budget; when given directly (``given=True``) the other
    terms are informational only. ``terms`` are the reserve's rows (startup_memory).
    """

    device_bytes: int
    gpu_memory_utilization: float
    usable_bytes: int
    weight_bytes: int
    activation_bytes: int
    kv_cache_bytes: int
    given: bool = False
    terms: tuple[MemoryTerm, ...] = ()
    weight_format: str = "model dtype"

    def to_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items() if k != "terms"}
        out["terms"] = [term._asdict() for term in self.terms]
        return out


def memory_budgets(
    model: ModelLike | ModelLayout,
    config: EngineConfig,
    *,
    device_bytes: int | None = None,
    weight_bytes: int | None = None,
    kv_cache_bytes: int | None = None,
    shape: ProfileShape | None = None,
    options: StartupOptions | None = None,
) -> list[MemoryBudget]:
    """One budget per worker (pp-major).

    ``kv_cache_bytes`` (or ``config.cache.kv_cache_memory_bytes``) skips the estimate;
    otherwise ``device_bytes`` is required and weights are estimated unless given
    (``weight_bytes`` is per worker). ``shape`` (from ``profile_shape``) and
    ``options`` (the vLLM flags) refine the estimate; without them the config's
    layout and vLLM 0.33's defaults are used.

    Args:
        model: bundled name, directory, config.json, Hub id, ModelSource or ModelLayout.
        config: the engine config (parallel sizes, ``gpu_memory_utilization``, batch limits).
        device_bytes: device memory per worker, in bytes (None: only with a given KV cache size).
        weight_bytes: weight bytes per worker (None: estimated).
        kv_cache_bytes: KV cache bytes per worker, skipping the estimate (None:
            ``config.cache.kv_cache_memory_bytes``).
        shape: the profiling shape (None: taken from the layout).
        options: the vLLM flags (None: vLLM 0.33's defaults).
    """
    layout = _as_layout(model, None)
    tp = config.parallel.tensor_parallel_size
    pp = config.parallel.pipeline_parallel_size
    util = config.cache.gpu_memory_utilization
    given = kv_cache_bytes if kv_cache_bytes is not None else config.cache.kv_cache_memory_bytes
    weights = (
        [weight_bytes] * tp * pp
        if weight_bytes is not None
        else weight_bytes_per_worker(layout, tp, pp, shape=shape, options=options)
    )
    terms = tuple(startup_terms(layout, config, shape, options))
    reserve = reserve_bytes(list(terms))
    device = device_bytes or 0
    usable = math.ceil(device * util)
    if given is None and not device_bytes:
        raise ConfigError("a KV cache budget needs the device memory (a GPU) or kv_cache_bytes")
    fmt = _stored_format(layout, shape)
    if options is not None:
        fmt = online_weight_format(options.quantization, fmt)
    budgets = []
    for weight in weights:
        kv = given if given is not None else usable - weight - reserve
        budgets.append(
            MemoryBudget(
                device, util, usable, weight, reserve, kv, given is not None, terms, fmt.label
            )
        )
    return budgets


def pipeline_stages(layout: ModelLayout, pp: int) -> list[tuple[Unit, ...]]:
    """Even split of the decoder layers; leftover layers go to the stages before the last."""
    count = len(layout.units)
    if pp > count:
        raise ModelConfigError(
            f"{layout.name}: pipeline_parallel_size ({pp}) is larger than the number of "
            f"layers (num_hidden_layers = {count})"
        )
    sizes = [count // pp] * pp
    for i in range(count % pp):
        sizes[pp - 2 - i] += 1
    stages, start = [], 0
    for size in sizes:
        stages.append(layout.units[start : start + size])
        start += size
    return stages


class _SpecOptions(NamedTuple):
    tensor_parallel_size: int
    pipeline_parallel_size: int
    kv_cache_dtype: str
    block_size: int  # tokens
    mamba_cache_mode: MambaCacheMode
    gdn_prefill_kernel: str


def _resolve_options(
    config: EngineConfig | None, tp: int, pp: int, kv_cache_dtype: str, block_size: int
) -> _SpecOptions:
    if config is None:
        defaults = CacheConfig()
        return _SpecOptions(
            tp,
            pp,
            kv_cache_dtype,
            block_size,
            defaults.resolved_mamba_cache_mode,
            defaults.gdn_prefill_kernel,
        )
    given: dict[str, tuple[Any, Any]] = {
        "tensor_parallel_size": (tp, 1),
        "pipeline_parallel_size": (pp, 1),
    }
    given.update({"kv_cache_dtype": (kv_cache_dtype, "auto"), "block_size": (block_size, 16)})
    from_config = {
        "tensor_parallel_size": config.parallel.tensor_parallel_size,
        "pipeline_parallel_size": config.parallel.pipeline_parallel_size,
        "kv_cache_dtype": config.cache.cache_dtype,
        "block_size": config.cache.block_size,
    }
    for name, (value, default) in given.items():
        if value != default and value != from_config[name]:
            raise ConfigError(
                f"get_kv_cache_specs: {name}={value!r} conflicts with the config's "
                f"{from_config[name]!r}; pass one or the other"
            )
    return _SpecOptions(
        config.parallel.tensor_parallel_size,
        config.parallel.pipeline_parallel_size,
        config.cache.cache_dtype,
        config.cache.block_size,
        config.cache.resolved_mamba_cache_mode,
        config.cache.gdn_prefill_kernel,
    )


def get_kv_cache_specs(
    model: ModelLike | ModelLayout,
    *,
    tensor_parallel_size: int = 1,
    pipeline_parallel_size: int = 1,
    kv_cache_dtype: str = "auto",
    block_size: int = 16,
    config: EngineConfig | None = None,
    use_transformers: bool | None = None,
) -> list[dict[str, KVCacheSpec]]:
    """One ``{layer name: spec}`` per worker, rank order pp-major (worker = pp_rank * tp + tp_rank).

    With ``config`` its parallel sizes, cache dtype, block size, Mamba cache mode and
    gated-DeltaNet prefill kernel are used (keyword arguments may repeat them but not
    contradict them). Mamba specs get ``block_size`` unpadded: the planner aligns block
    sizes and pads pages.

    Args:
        model: bundled name, directory, config.json, Hub id, ModelSource or ModelLayout.
        tensor_parallel_size: workers each stage's layers are split over.
        pipeline_parallel_size: stages the layers are split into.
        kv_cache_dtype: the cache dtype (``"auto"``: the model's dtype).
        block_size: tokens per block.
        config: an engine config supplying all of the above, the Mamba cache mode and the GDN
            prefill kernel (None: the arguments).
        use_transformers: read the config through transformers (True: required; False: never; None:
            when installed).
    """
    tp, pp, dtype, block_size, mode, kernel = _resolve_options(
        config, tensor_parallel_size, pipeline_parallel_size, kv_cache_dtype, block_size
    )
    for name, value in (("tensor_parallel_size", tp), ("pipeline_parallel_size", pp)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ConfigError(f"{name} must be a positive integer, got {value!r}")
    layout = _as_layout(model, use_transformers)
    kv_dtype = layout.dtype if dtype == "auto" else canonical_dtype_name(dtype)
    workers: list[dict[str, KVCacheSpec]] = []
    for units in pipeline_stages(layout, pp):
        stage = {
            layer.name: layer_spec(
                layout,
                layer,
                tp=tp,
                kv_dtype=kv_dtype,
                block_size=block_size,
                mamba_cache_mode=mode,
                gdn_prefill_kernel=kernel,
            )
            for unit in units
            for layer in unit.layers
        }
        workers.extend(dict(stage) for _ in range(tp))
    return workers
