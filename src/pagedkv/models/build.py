"""From a model config to each worker's ``{layer name: KVCacheSpec}``."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from pagedkv.dtypes import canonical_dtype_name
from pagedkv.errors import ConfigError, ModelConfigError
from pagedkv.models.adapters import find_adapter
from pagedkv.models.layers import (
    AttentionLayer,
    LatentLayer,
    LayerDesc,
    ModelLayout,
    StateLayer,
    Unit,
    shard,
)
from pagedkv.models.source import (
    ConfigView,
    ModelSource,
    bundled_models_dir,
    load_model_config,
    normalize_with_transformers,
    transformers_mode,
)
from pagedkv.specs import (
    ChunkedLocalAttentionSpec,
    CrossAttentionSpec,
    FullAttentionSpec,
    KVCacheSpec,
    MambaSpec,
    MLAAttentionSpec,
    SinkFullAttentionSpec,
    SlidingWindowMLASpec,
    SlidingWindowSpec,
)

if TYPE_CHECKING:
    from pagedkv.config import EngineConfig, MambaCacheMode

ModelLike = str | Path | ModelSource


def describe_model(model: ModelLike, *, use_transformers: bool | None = None) -> ModelLayout:
    """Read a config (bundled name, directory, file or ModelSource) into a ModelLayout.

    ``use_transformers``: True requires transformers, False never uses it, None
    (default) uses it when installed unless ``PAGEDKV_TRANSFORMERS=0``, except for
    bundled configs: tests prove both paths give the same specs for those, and
    importing transformers costs seconds.
    """
    source = load_model_config(model)
    adapter = find_adapter(source)
    if use_transformers is None and transformers_mode(None) is None and _is_bundled(source):
        use_transformers = False
    normalized, _ = normalize_with_transformers(source.name, source.raw, use_transformers)
    view = ConfigView(source.name, source.text_config, normalized)
    return adapter.describe(view, source)


def _is_bundled(source: ModelSource) -> bool:
    return source.path is not None and source.path.parent.parent == bundled_models_dir()


def _as_layout(model: ModelLike | ModelLayout, use_transformers: bool | None) -> ModelLayout:
    if isinstance(model, ModelLayout):
        return model
    return describe_model(model, use_transformers=use_transformers)


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


def _kv_heads_per_rank(model: str, layer: AttentionLayer, tp: int) -> int:
    shard(model, f"num_attention_heads of {layer.name}", layer.num_heads, tp)
    kv = layer.num_kv_heads
    if kv >= tp:
        return shard(model, f"num_key_value_heads of {layer.name}", kv, tp)
    if tp % kv:
        raise ModelConfigError(
            f"{model}: tensor_parallel_size ({tp}) must be a multiple of "
            f"num_key_value_heads of {layer.name} ({kv}) to replicate KV heads"
        )
    return 1


def attention_spec(
    model: str, layer: AttentionLayer, tp: int, dtype: str, block_size: int
) -> KVCacheSpec:
    if dtype == DS_MLA_DTYPE:
        raise ConfigError(
            f"{model}: kv_cache_dtype fp8_ds_mla applies to MLA models only "
            f"({layer.name} is standard attention); use fp8"
        )
    common: dict[str, Any] = {
        "block_size": block_size,
        "num_kv_heads": _kv_heads_per_rank(model, layer, tp),
        "head_size": layer.head_size,
        "head_size_v": layer.head_size_v,
        "dtype": dtype,
        "max_tp_shards": layer.num_kv_heads,
    }
    if layer.cross:
        return CrossAttentionSpec(**common)
    if layer.sliding_window is not None:
        return SlidingWindowSpec(sliding_window=layer.sliding_window, **common)
    if layer.chunk_size is not None:
        return ChunkedLocalAttentionSpec(attention_chunk_size=layer.chunk_size, **common)
    if layer.sinks:
        return SinkFullAttentionSpec(**common)
    return FullAttentionSpec(**common)


# fp8_ds_mla packs a 512 + 64 latent into 656 bytes a token: 512 fp8 values, four fp32
# scales and the 64 rope values in bf16.
DS_MLA_DTYPE = "fp8_ds_mla"
DS_MLA_LATENT_SIZE = 576
DS_MLA_BYTES_PER_TOKEN = 512 + 4 * 4 + 64 * 2


def _ds_mla_fields(model: str, layer: LatentLayer) -> dict[str, Any]:
    if layer.latent_size != DS_MLA_LATENT_SIZE:
        raise ConfigError(
            f"{model}: kv_cache_dtype fp8_ds_mla packs a {DS_MLA_LATENT_SIZE}-value latent; "
            f"{layer.name} has {layer.latent_size}"
        )
    return {"dtype": "uint8", "state_content_bytes": DS_MLA_BYTES_PER_TOKEN}


def latent_spec(
    model: str, layer: LatentLayer, tp: int, dtype: str, block_size: int
) -> KVCacheSpec:
    if layer.num_heads > 1:
        shard(model, f"num_attention_heads of {layer.name}", layer.num_heads, tp)
    common: dict[str, Any] = {
        "block_size": block_size,
        "num_kv_heads": 1,
        "head_size": layer.latent_size,
        "dtype": layer.dtype or dtype,
        "max_tp_shards": 1,
    }
    if common["dtype"] == DS_MLA_DTYPE:
        common.update(_ds_mla_fields(model, layer))
    if layer.sliding_window is not None:
        return SlidingWindowMLASpec(sliding_window=layer.sliding_window, **common)
    return MLAAttentionSpec(**common)


def state_spec(
    model: str,
    layer: StateLayer,
    tp: int,
    model_dtype: str,
    block_size: int,
    mode: MambaCacheMode,
) -> MambaSpec:
    shapes = layer.state.shapes(model, tp)
    ssm = layer.ssm_dtype or model_dtype
    dtypes = (model_dtype,) + (ssm,) * (len(shapes) - 1)
    return MambaSpec(
        block_size=block_size,
        shapes=shapes,
        dtypes=dtypes,
        mamba_type=layer.state.mamba_type,
        mamba_cache_mode=mode,
    )


def layer_spec(
    layout: ModelLayout,
    layer: LayerDesc,
    *,
    tp: int,
    kv_dtype: str,
    block_size: int,
    mamba_cache_mode: MambaCacheMode,
) -> KVCacheSpec:
    """One layer's spec on one tensor-parallel rank."""
    if isinstance(layer, AttentionLayer):
        return attention_spec(layout.name, layer, tp, kv_dtype, block_size)
    if isinstance(layer, LatentLayer):
        return latent_spec(layout.name, layer, tp, kv_dtype, block_size)
    return state_spec(layout.name, layer, tp, layout.dtype, block_size, mamba_cache_mode)


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
