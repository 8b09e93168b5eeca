"""Helpers shared by the built-in adapters: dtypes, layer-type names, parameter formulas."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NamedTuple

from pagedkv.dtypes import canonical_dtype_name, dtype_size
from pagedkv.errors import ModelConfigError, UnknownDtypeError
from pagedkv.models.layers import ModelLayout, Unit
from pagedkv.models.source import ConfigView, ModelSource
from pagedkv.models.states import GatedDeltaNetState, Mamba1State, Mamba2State

__all__ = [
    "MLPParams",
    "EmbeddingParams",
    "normalize_layer_types",
    "model_dtype",
    "build_layout",
    "decoder_layout",
    "checkpoint_params",
    "quant_method",
    "head_size",
    "attention_params",
    "gated_mlp_params",
    "moe_params",
    "embedding_params",
    "max_positions",
    "mamba2_params",
    "mamba1_params",
    "gdn_params",
    "num_kv_heads",
]

FULL, SLIDING, CHUNKED, LINEAR, MLP = "full", "sliding", "chunked", "linear", "mlp"

_LAYER_TYPE_NAMES = {
    "full_attention": FULL,
    "attention": FULL,
    "global": FULL,
    "global_attention": FULL,
    "indexed_attention": FULL,
    "sliding_attention": SLIDING,
    "sliding_window": SLIDING,
    "local": SLIDING,
    "local_attention": SLIDING,
    "chunked_attention": CHUNKED,
    "linear_attention": LINEAR,
    "mamba": LINEAR,
    "mamba2": LINEAR,
    "mlp": MLP,
    "moe": MLP,
}


def normalize_layer_types(view: ConfigView, key: str, num_layers: int) -> list[str] | None:
    """The config's per-layer types mapped onto FULL / SLIDING / CHUNKED / LINEAR / MLP."""
    values = view.list(key)
    if values is None:
        return None
    if len(values) != num_layers:
        raise ModelConfigError(
            f"{view.model}: config field {view.prefix}{key!r} has {len(values)} entries "
            f"for {num_layers} layers"
        )
    out = []
    for value in values:
        kind = _LAYER_TYPE_NAMES.get(str(value).lower())
        if kind is None:
            raise ModelConfigError(
                f"{view.model}: config field {view.prefix}{key!r} has unknown layer type {value!r}"
            )
        out.append(kind)
    return out


def model_dtype(view: ConfigView, source: ModelSource) -> str:
    """The serving dtype: the config's, float32 checkpoints served in bfloat16 (vLLM's auto)."""
    value: Any = None
    for holder in (view.published, source.raw, view.normalized):
        value = holder.get("torch_dtype") or holder.get("dtype")
        if value:
            break
    if not value:
        return "bfloat16"
    try:
        name = canonical_dtype_name(value)
    except UnknownDtypeError:
        raise ModelConfigError(
            f"{view.model}: config field 'torch_dtype' {value!r} is not known"
        ) from None
    return "bfloat16" if name == "float32" else name


def build_layout(
    adapter: object,
    view: ConfigView,
    source: ModelSource,
    units: Iterable[Unit],
    *,
    hidden_size: int,
    intermediate_size: int,
    embedding_params: int,
    head_params: int,
    max_model_len: int | None,
    encoder_params: int = 0,
    max_encoder_len: int | None = None,
) -> ModelLayout:
    """A ModelLayout whose name, architecture, dtype and quantization come from the config.

    Args:
        adapter: the model adapter; its class name is the architecture when the config names none.
        view: the (text) config as its config class reads it.
        source: the model's files (config, checkpoint index).
        units: the model's repeated units (decoder layers), in order.
        hidden_size: the model's hidden size, in elements.
        intermediate_size: the dense MLP's intermediate size, in elements.
        embedding_params: parameters of the input embedding.
        head_params: parameters of the output head (0 when tied).
        max_model_len: the model's length limit in tokens (None: none stated).
        encoder_params: parameters of encoder towers, held by the first pipeline stage.
        max_encoder_len: the encoder's input limit in tokens (None: no encoder).
    """
    quant = quant_method(source, view)
    return ModelLayout(
        name=view.model,
        architecture=source.architecture or source.model_type or type(adapter).__name__,
        dtype=model_dtype(view, source),
        units=tuple(units),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        embedding_params=embedding_params,
        head_params=head_params,
        encoder_params=encoder_params,
        max_model_len=max_model_len,
        max_encoder_len=max_encoder_len,
        quant_method=quant,
        checkpoint_params=checkpoint_params(source, quant),
        checkpoint_bytes=source.checkpoint.total_bytes if source.checkpoint else None,
    )


def decoder_layout(
    adapter: object,
    view: ConfigView,
    source: ModelSource,
    units: Iterable[Unit],
    hidden_size: int,
    intermediate_size: int,
    tied_default: bool = False,
) -> ModelLayout:
    """``build_layout`` for a decoder-only model: embeddings of ``vocab_size`` (the head
    tied or not) and the length limit from ``max_position_embeddings`` or its aliases.

    Args:
        adapter: the model adapter; its class name is the architecture when the config names none.
        view: the (text) config as its config class reads it.
        source: the model's files (config, checkpoint index).
        units: the model's repeated units (decoder layers), in order.
        hidden_size: the model's hidden size, in elements.
        intermediate_size: the dense MLP's intermediate size, in elements.
        tied_default: whether the head is tied to the embedding when the config does not say.
    """
    embed, head = embedding_params(view, source, hidden_size, tied_default)
    return build_layout(
        adapter,
        view,
        source,
        units,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        embedding_params=embed,
        head_params=head,
        max_model_len=max_positions(view),
    )


def checkpoint_params(source: ModelSource, quant: str | None) -> int | None:
    """The safetensors index's parameter count; else, for an unquantised checkpoint, its
    total size over the stored dtype's size; else None (the config's count is used)."""
    ckpt = source.checkpoint
    if ckpt is None or ckpt.num_params:
        return ckpt.num_params if ckpt else None
    stored = source.text_config.get("torch_dtype") or source.raw.get("torch_dtype")
    if not ckpt.total_bytes or quant is not None or not isinstance(stored, str):
        return None
    try:
        return ckpt.total_bytes // dtype_size(stored)
    except UnknownDtypeError:
        return None


def quant_method(source: ModelSource, view: ConfigView) -> str | None:
    for holder in (source.raw, view.published):
        quant = holder.get("quantization_config")
        if isinstance(quant, dict) and isinstance(quant.get("quant_method"), str):
            return str(quant["quant_method"]).lower()
    return None


def head_size(view: ConfigView) -> int:
    """``head_dim`` when given, else hidden_size / num_attention_heads."""
    if view.has("head_dim"):
        return view.int("head_dim")
    return view.int("hidden_size") // view.int("num_attention_heads")


def attention_params(hidden: int, heads: int, kv_heads: int, head: int, head_v: int = -1) -> int:
    """Parameters of one attention layer's q, k, v and output projections (no biases).

    Args:
        hidden: the model's hidden size, in elements.
        heads: query heads.
        kv_heads: key/value heads.
        head: elements per query and key head.
        head_v: elements per value head (-1: ``head``).
    """
    head_v = head if head_v < 0 else head_v
    return hidden * heads * head + hidden * kv_heads * (head + head_v) + heads * head_v * hidden


class MLPParams(NamedTuple):
    """A layer's feed-forward parameters, split by how the checkpoint may store them."""

    dense_params: int  # a dense MLP, or a MoE layer's router and shared expert
    expert_params: int  # the routed experts (0: not a MoE layer)


class EmbeddingParams(NamedTuple):
    """A model's embedding parameters."""

    input_params: int  # the input embedding
    head_params: int  # the output head (0: tied to the input embedding)


def gated_mlp_params(hidden: int, intermediate: int) -> int:
    return 3 * hidden * intermediate


def moe_params(
    hidden: int, num_experts: int, expert_intermediate: int, shared_intermediate: int = 0
) -> MLPParams:
    """A MoE layer's parameters: router and shared expert (dense), and the experts.

    Args:
        hidden: the model's hidden size, in elements.
        num_experts: routed experts.
        expert_intermediate: each expert's intermediate size, in elements.
        shared_intermediate: the shared expert's intermediate size, in elements (0: none).
    """
    dense = hidden * num_experts + gated_mlp_params(hidden, shared_intermediate)
    return MLPParams(dense, num_experts * gated_mlp_params(hidden, expert_intermediate))


def embedding_params(
    view: ConfigView, source: ModelSource, hidden: int, tied_default: bool = False
) -> EmbeddingParams:
    """Input embedding and output head parameters; the head is 0 when tied.

    Args:
        view: the config as its config class reads it (``vocab_size``, ``tie_word_embeddings``).
        source: the model's files, whose raw config is read when the view does not publish the tie.
        hidden: the model's hidden size, in elements.
        tied_default: whether the head is tied when neither config says.
    """
    vocab = view.int("vocab_size")
    tied = view.published.get("tie_word_embeddings")
    if tied is None:
        tied = source.raw.get("tie_word_embeddings", tied_default)
    return EmbeddingParams(vocab * hidden, 0 if tied else vocab * hidden)


def max_positions(view: ConfigView) -> int | None:
    for key in ("max_position_embeddings", "n_positions", "max_target_positions"):
        if view.has(key):
            return view.int(key)
    return None


def mamba2_params(hidden: int, state: Mamba2State) -> int:
    groups_dim = 2 * state.n_groups * state.state_size
    in_proj = hidden * (2 * state.intermediate_size + groups_dim + state.num_heads)
    conv = (state.intermediate_size + groups_dim) * state.conv_kernel
    return in_proj + conv + state.intermediate_size * hidden + 3 * state.num_heads


def mamba1_params(hidden: int, state: Mamba1State, dt_rank: int) -> int:
    inner = state.intermediate_size
    x_proj = inner * (dt_rank + 2 * state.state_size)
    return (
        hidden * 2 * inner
        + inner * state.conv_kernel
        + x_proj
        + dt_rank * inner
        + (inner * state.state_size + inner * hidden)
    )


def gdn_params(hidden: int, state: GatedDeltaNetState) -> int:
    key_dim = state.num_key_heads * state.key_head_dim
    value_dim = state.num_value_heads * state.value_head_dim
    in_proj = hidden * (2 * key_dim + 2 * value_dim + 2 * state.num_value_heads)
    conv = (2 * key_dim + value_dim) * state.conv_kernel
    return in_proj + conv + value_dim * hidden


def num_kv_heads(view: ConfigView, num_heads: int) -> int:
    """``num_key_value_heads`` (default: one per query head); it must divide the query heads."""
    kv_heads = view.int("num_key_value_heads", num_heads)
    if num_heads % kv_heads:
        raise ModelConfigError(
            f"{view.model}: num_key_value_heads ({kv_heads}) must divide "
            f"num_attention_heads ({num_heads}): each KV head serves a whole group of query heads"
        )
    return kv_heads
