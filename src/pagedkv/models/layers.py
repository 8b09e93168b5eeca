"""A model's cache-holding layers, architecture-neutral, and the KV cache spec each
gives on one tensor-parallel rank.

Adapters turn a config into a ModelLayout of these; ``models.workers`` splits it over
pipeline stages and asks each layer for its spec.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pagedkv.config import DEFAULT_GDN_PREFILL_KERNEL
from pagedkv.errors import ConfigError, ModelConfigError
from pagedkv.specs import (
    ChunkedLocalAttentionSpec,
    CircularBufferSpec,
    CrossAttentionSpec,
    FullAttentionSpec,
    KVCacheSpec,
    MambaSpec,
    MLAAttentionSpec,
    SinkFullAttentionSpec,
    SlidingWindowMLASpec,
    SlidingWindowSpec,
)

__all__ = [
    "shard",
    "AttentionLayer",
    "LatentLayer",
    "RingLayer",
    "StateShape",
    "StateLayer",
    "LayerDesc",
    "Unit",
    "ModelLayout",
    "attention_spec",
    "DS_MLA_DTYPE",
    "DS_MLA_LATENT_SIZE",
    "DS_MLA_BYTES_PER_TOKEN",
    "latent_spec",
    "state_spec",
    "layer_spec",
]

if TYPE_CHECKING:
    from pagedkv.config import MambaCacheMode


def shard(model: str, field_name: str, value: int, tp: int) -> int:
    """``value / tp``, or a ModelConfigError naming the field when it does not divide.

    Args:
        model: the model's name, for the error.
        field_name: the field divided, for the error.
        value: the value to split.
        tp: the tensor-parallel size.
    """
    if value % tp:
        raise ModelConfigError(
            f"{model}: {field_name} ({value}) is not divisible by tensor_parallel_size ({tp})"
        )
    return value // tp


@dataclass(frozen=True)
class AttentionLayer:
    """Per-token K/V layer: full, sliding-window, chunked-local, with sinks, or cross."""

    name: str
    num_heads: int
    num_kv_heads: int
    head_size: int
    head_size_v: int | None = None
    sliding_window: int | None = None
    chunk_size: int | None = None
    sinks: bool = False
    cross: bool = False

    @property
    def kind(self) -> str:
        if self.cross:
            return "cross_attention"
        if self.sliding_window is not None:
            return "sliding_window"
        if self.chunk_size is not None:
            return "chunked_local_attention"
        return "sink_full_attention" if self.sinks else "full_attention"


@dataclass(frozen=True)
class LatentLayer:
    """One compressed vector per token shared by all heads (MLA, or a sparse-attention indexer).

    ``dtype`` fixes the storage format (an indexer's packed fp8 + scales); None
    means the KV cache dtype.
    """

    name: str
    num_heads: int
    latent_size: int
    dtype: str | None = None
    sliding_window: int | None = None
    # DeepSeek-V4: tokens compressed into one latent, page alignment in bytes, and a block
    # size of the layer's own (None: the engine's).
    tokens_per_state: int = 1
    alignment: int | None = None
    block_size: int | None = None
    model_version: str | None = None

    @property
    def kind(self) -> str:
        return "mla_attention" if self.sliding_window is None else "sliding_window_mla"


@dataclass(frozen=True)
class RingLayer:
    """A per-request ring of ``block_size`` rows (a compressor's open token group)."""

    name: str
    num_kv_heads: int
    head_size: int
    block_size: int
    dtype: str = "float32"

    @property
    def kind(self) -> str:
        return "circular_buffer"


class StateShape(ABC):
    """Recurrent state tensors of one layer, sharded over tensor-parallel ranks."""

    mamba_type: str = "mamba2"

    @abstractmethod
    def shapes(self, model: str, tp: int) -> tuple[tuple[int, ...], ...]:
        """Per-rank state tensor shapes (conv first)."""

    def prefill_checkpoint_alignment(
        self,
        block_size: int,
        mode: MambaCacheMode,
        gdn_prefill_kernel: str = DEFAULT_GDN_PREFILL_KERNEL,
    ) -> int | None:
        """The token step vLLM's kernel exports a state at inside a prefill chunk (its
        spec's ``prefill_checkpoint_alignment``) with ``block_size`` blocks in ``mode``
        (gated DeltaNet: with ``gdn_prefill_kernel``), None if it cannot."""
        return None


@dataclass(frozen=True)
class StateLayer:
    """A Mamba / linear-attention layer: a fixed-size state per request.

    ``ssm_dtype`` is the dtype the config publishes for the recurrent state (None: model dtype).
    """

    name: str
    state: StateShape
    ssm_dtype: str | None = None

    @property
    def kind(self) -> str:
        return "mamba"


LayerDesc = AttentionLayer | LatentLayer | StateLayer | RingLayer


@dataclass(frozen=True)
class Unit:
    """One pipeline-splittable decoder layer: its cache layers and parameter counts."""

    index: int
    layers: tuple[LayerDesc, ...] = ()
    params: int = 0
    expert_params: int = 0


@dataclass(frozen=True)
class ModelLayout:
    """What an adapter reads from a config.

    ``units`` are split across pipeline stages; ``embedding_params`` sit on the first
    stage (with ``encoder_params``), ``head_params`` (0 if tied) on the last.
    """

    name: str
    architecture: str
    dtype: str
    units: tuple[Unit, ...]
    hidden_size: int
    intermediate_size: int
    embedding_params: int
    head_params: int
    encoder_params: int = 0
    max_model_len: int | None = None
    max_encoder_len: int | None = None
    quant_method: str | None = None
    # From the checkpoint's safetensors index, when it says (Hub or local directory).
    checkpoint_params: int | None = None
    checkpoint_bytes: int | None = None
    # Config fields the file left out, read from its class defaults (field, value), and
    # where those defaults came from (transformers' class, or pagedkv's copy of them).
    filled_fields: tuple[tuple[str, Any], ...] = ()
    defaults_from: str | None = None

    @property
    def layers(self) -> list[LayerDesc]:
        return [layer for unit in self.units for layer in unit.layers]

    @property
    def config_params(self) -> int:
        """Parameters counted from the config (norms, biases and vision towers left out)."""
        body = sum(u.params + u.expert_params for u in self.units)
        return body + self.embedding_params + self.head_params + self.encoder_params

    @property
    def num_params(self) -> int:
        """The checkpoint's own count when its index states one, else the config's."""
        return self.checkpoint_params or self.config_params

    def layer_kinds(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for layer in self.layers:
            kind = layer.kind
            counts[kind] = counts.get(kind, 0) + 1
        return counts


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
    """One standard attention layer's spec on one tensor-parallel rank.

    Args:
        model: the model's name, for errors.
        layer: the attention layer.
        tp: the tensor-parallel size the KV heads are split over.
        dtype: the cache dtype's name.
        block_size: tokens per block.
    """
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
    """One latent (MLA) attention layer's spec on one tensor-parallel rank.

    Args:
        model: the model's name, for errors.
        layer: the latent attention layer (its own block size and dtype win when set).
        tp: the tensor-parallel size the heads must divide by.
        dtype: the cache dtype's name.
        block_size: tokens per block.
    """
    if layer.num_heads > 1:
        shard(model, f"num_attention_heads of {layer.name}", layer.num_heads, tp)
    common: dict[str, Any] = {
        "block_size": layer.block_size or block_size,
        "num_kv_heads": 1,
        "head_size": layer.latent_size,
        "dtype": layer.dtype or dtype,
        "max_tp_shards": 1,
    }
    if common["dtype"] == DS_MLA_DTYPE:
        common.update(_ds_mla_fields(model, layer))
    if layer.model_version is not None:
        common.update(alignment=layer.alignment, model_version=layer.model_version)
        common.update(cache_dtype_str="auto")
    if layer.tokens_per_state != 1:
        common["tokens_per_state"] = layer.tokens_per_state
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
    gdn_prefill_kernel: str = DEFAULT_GDN_PREFILL_KERNEL,
) -> MambaSpec:
    """One state (Mamba-like) layer's spec on one tensor-parallel rank.

    Args:
        model: the model's name, for errors.
        layer: the state layer.
        tp: the tensor-parallel size the state shapes are split over.
        model_dtype: the model's dtype (the conv state's; the SSM state's unless the layer names
            one).
        block_size: tokens per block, unpadded.
        mode: the Mamba cache mode (decides the prefill checkpoint alignment).
        gdn_prefill_kernel: the gated-DeltaNet prefill kernel (with the mode, decides a GDN
            layer's checkpoint alignment).
    """
    shapes = layer.state.shapes(model, tp)
    ssm = layer.ssm_dtype or model_dtype
    dtypes = (model_dtype,) + (ssm,) * (len(shapes) - 1)
    alignment = layer.state.prefill_checkpoint_alignment(block_size, mode, gdn_prefill_kernel)
    return MambaSpec(
        block_size=block_size,
        shapes=shapes,
        dtypes=dtypes,
        mamba_type=layer.state.mamba_type,
        mamba_cache_mode=mode,
        num_prefill_checkpoint_blocks=0 if alignment is None else 1,
        prefill_checkpoint_alignment=alignment,
    )


def layer_spec(
    layout: ModelLayout,
    layer: LayerDesc,
    *,
    tp: int,
    kv_dtype: str,
    block_size: int,
    mamba_cache_mode: MambaCacheMode,
    gdn_prefill_kernel: str = DEFAULT_GDN_PREFILL_KERNEL,
) -> KVCacheSpec:
    """One layer's spec on one tensor-parallel rank.

    Args:
        layout: the model's layout (name and dtype).
        layer: the layer described.
        tp: the tensor-parallel size.
        kv_dtype: the cache dtype's name.
        block_size: tokens per block.
        mamba_cache_mode: the Mamba cache mode, for state layers.
        gdn_prefill_kernel: the gated-DeltaNet prefill kernel (CacheConfig's), for GDN layers.
    """
    if isinstance(layer, AttentionLayer):
        return attention_spec(layout.name, layer, tp, kv_dtype, block_size)
    if isinstance(layer, LatentLayer):
        return latent_spec(layout.name, layer, tp, kv_dtype, block_size)
    if isinstance(layer, RingLayer):
        return CircularBufferSpec(
            block_size=layer.block_size,
            num_kv_heads=layer.num_kv_heads,
            head_size=layer.head_size,
            head_size_v=0,
            dtype=layer.dtype,
        )
    return state_spec(
        layout.name, layer, tp, layout.dtype, block_size, mamba_cache_mode, gdn_prefill_kernel
    )
