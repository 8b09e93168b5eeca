"""What an engine's workers get from a model: each one's ``{layer name: KVCacheSpec}``
(pipeline stages x tensor-parallel ranks), the EngineConfig, and each one's memory
(weights, activation reserve, KV cache budget)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pagedkv.config import EngineConfig
from pagedkv.dtypes import canonical_dtype_name, dtype_size
from pagedkv.errors import ConfigError, ModelConfigError
from pagedkv.models.adapters import describe_model
from pagedkv.models.layers import ModelLayout, Unit, layer_spec
from pagedkv.models.source import ModelLike
from pagedkv.specs import KVCacheSpec

if TYPE_CHECKING:
    from pagedkv.config import MambaCacheMode

# Memory outside PyTorch's allocator (CUDA context, NCCL, graphs), per worker.
NON_TORCH_RESERVE_BYTES = 512 * 2**20


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


# Bits per weight of quantised linear layers, scales included (mxfp4: 1 scale byte per 32).
_QUANT_BITS = {"fp8": 8.0, "fbgemm_fp8": 8.0, "mxfp4": 4.25, "awq": 4.25, "gptq": 4.25}
# Formats that quantise only the MoE experts.
_EXPERTS_ONLY = {"mxfp4"}


def bytes_per_param(layout: ModelLayout) -> tuple[float, float]:
    """(dense linear, expert) bytes per parameter."""
    base = float(dtype_size(layout.dtype))
    bits = _QUANT_BITS.get(layout.quant_method or "")
    if bits is None:
        return base, base
    quant = bits / 8
    return (base if layout.quant_method in _EXPERTS_ONLY else quant), quant


def weight_bytes_per_worker(
    model: ModelLike | ModelLayout, tensor_parallel_size: int = 1, pipeline_parallel_size: int = 1
) -> list[int]:
    """Estimated weight bytes on each worker (pp-major).

    Every stage holds its layers, the first also the embedding (and encoder), the
    last the output head; tensor parallelism divides each stage evenly. Norms,
    biases and vision towers are not counted, unless the checkpoint's index states
    its total size: then the split is scaled to that total.
    """
    layout = _as_layout(model, None)
    tp, pp = tensor_parallel_size, pipeline_parallel_size
    dense, expert = bytes_per_param(layout)
    base = dtype_size(layout.dtype)
    out: list[int] = []
    stages = pipeline_stages(layout, pp)
    for rank, units in enumerate(stages):
        total = sum(u.params * dense + u.expert_params * expert for u in units)
        if rank == 0:
            total += layout.embedding_params * base + layout.encoder_params * dense
        if rank == len(stages) - 1:
            total += layout.head_params * base
        out.extend([int(-(-total // tp))] * tp)
    estimated = sum(out)
    if layout.checkpoint_bytes and estimated:
        scale = layout.checkpoint_bytes / estimated
        out = [int(-(-(w * scale) // 1)) for w in out]
    return out


def estimate_weight_bytes(
    model: ModelLike | ModelLayout, tensor_parallel_size: int = 1, pipeline_parallel_size: int = 1
) -> int:
    """Weight bytes of the most loaded worker (what its memory budget must hold)."""
    return max(weight_bytes_per_worker(model, tensor_parallel_size, pipeline_parallel_size))


def activation_reserve_bytes(layout: ModelLayout, config: EngineConfig) -> int:
    """Peak activation memory of one forward pass, per worker, plus a fixed non-torch reserve.

    ``max_num_batched_tokens x (2 x intermediate / tp + 4 x hidden) x dtype bytes``
    (the MLP's gate/up output and a few residual copies) plus fp32 logits for
    ``max_num_seqs`` sequences, plus NON_TORCH_RESERVE_BYTES. A stated estimate, not a
    profile: pass the KV budget directly when you know it.
    """
    tp = config.parallel.tensor_parallel_size
    tokens = config.scheduler.max_num_batched_tokens
    width = 2 * layout.intermediate_size // tp + 4 * layout.hidden_size
    vocab = layout.embedding_params // max(layout.hidden_size, 1)
    logits = config.scheduler.max_num_seqs * -(-vocab // tp) * 4
    return tokens * width * dtype_size(layout.dtype) + logits + NON_TORCH_RESERVE_BYTES


@dataclass(frozen=True)
class MemoryBudget:
    """KV cache memory of one worker: ``device x utilization - weights - activations``.

    ``kv_cache_bytes`` is the budget; when given directly (``given=True``) the other
    terms are informational only.
    """

    device_bytes: int
    gpu_memory_utilization: float
    usable_bytes: int
    weight_bytes: int
    activation_bytes: int
    kv_cache_bytes: int
    given: bool = False

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def memory_budgets(
    model: ModelLike | ModelLayout,
    config: EngineConfig,
    *,
    device_bytes: int | None = None,
    weight_bytes: int | None = None,
    kv_cache_bytes: int | None = None,
) -> list[MemoryBudget]:
    """One budget per worker (pp-major).

    ``kv_cache_bytes`` (or ``config.cache.kv_cache_memory_bytes``) skips the estimate;
    otherwise ``device_bytes`` is required and weights are estimated unless given
    (``weight_bytes`` is per worker).
    """
    layout = _as_layout(model, None)
    tp = config.parallel.tensor_parallel_size
    pp = config.parallel.pipeline_parallel_size
    util = config.cache.gpu_memory_utilization
    given = kv_cache_bytes if kv_cache_bytes is not None else config.cache.kv_cache_memory_bytes
    weights = (
        [weight_bytes] * tp * pp
        if weight_bytes is not None
        else weight_bytes_per_worker(layout, tp, pp)
    )
    activations = activation_reserve_bytes(layout, config)
    device = device_bytes or 0
    usable = int(device * util)
    if given is None and not device_bytes:
        raise ConfigError("a KV cache budget needs the device memory (a GPU) or kv_cache_bytes")
    budgets = []
    for weight in weights:
        kv = given if given is not None else usable - weight - activations
        budgets.append(
            MemoryBudget(device, util, usable, weight, activations, kv, given is not None)
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


def _resolve_options(
    config: EngineConfig | None, tp: int, pp: int, kv_cache_dtype: str, block_size: int
) -> tuple[int, int, str, int, MambaCacheMode]:
    from pagedkv.config import CacheConfig

    if config is None:
        return tp, pp, kv_cache_dtype, block_size, CacheConfig().resolved_mamba_cache_mode
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
    return (
        config.parallel.tensor_parallel_size,
        config.parallel.pipeline_parallel_size,
        config.cache.cache_dtype,
        config.cache.block_size,
        config.cache.resolved_mamba_cache_mode,
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

    With ``config`` its parallel sizes, cache dtype, block size and Mamba cache mode
    are used (keyword arguments may repeat them but not contradict them). Mamba
    specs get ``block_size`` unpadded: the planner aligns block sizes and pads pages.
    """
    tp, pp, dtype, block_size, mode = _resolve_options(
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
            )
            for unit in units
            for layer in unit.layers
        }
        workers.extend(dict(stage) for _ in range(tp))
    return workers
