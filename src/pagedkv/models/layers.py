"""Architecture-neutral descriptions of a model's cache-holding layers.

Adapters turn a config into these; ``models.build`` turns them into KV cache
specs for one tensor-parallel rank.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

from pagedkv.errors import ModelConfigError


def shard(model: str, field_name: str, value: int, tp: int) -> int:
    """``value / tp``, or a ModelConfigError naming the field when it does not divide."""
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

    @property
    def kind(self) -> str:
        return "mla_attention" if self.sliding_window is None else "sliding_window_mla"


class StateShape(ABC):
    """Recurrent state tensors of one layer, sharded over tensor-parallel ranks."""

    mamba_type: str = "mamba2"

    @abstractmethod
    def shapes(self, model: str, tp: int) -> tuple[tuple[int, ...], ...]:
        """Per-rank state tensor shapes (conv first)."""


@dataclass(frozen=True)
class Mamba1State(StateShape):
    intermediate_size: int
    state_size: int
    conv_kernel: int

    mamba_type = "mamba1"

    def shapes(self, model: str, tp: int) -> tuple[tuple[int, ...], ...]:
        inner = shard(model, "mamba intermediate size", self.intermediate_size, tp)
        return ((inner, self.conv_kernel - 1), (inner, self.state_size))


@dataclass(frozen=True)
class Mamba2State(StateShape):
    intermediate_size: int
    num_heads: int
    head_dim: int
    n_groups: int
    state_size: int
    conv_kernel: int

    mamba_type = "mamba2"

    def shapes(self, model: str, tp: int) -> tuple[tuple[int, ...], ...]:
        heads = shard(model, "mamba num_heads", self.num_heads, tp)
        groups = self.n_groups
        if groups % tp:
            if groups != 1:
                raise ModelConfigError(
                    f"{model}: mamba n_groups ({groups}) must be 1 or divisible by "
                    f"tensor_parallel_size ({tp})"
                )
            groups = tp  # one group replicated onto every rank
        conv_dim = self.intermediate_size + 2 * groups * self.state_size
        conv = shard(model, "mamba conv dim", conv_dim, tp)
        return ((conv, self.conv_kernel - 1), (heads, self.head_dim, self.state_size))


@dataclass(frozen=True)
class GatedDeltaNetState(StateShape):
    num_key_heads: int
    num_value_heads: int
    key_head_dim: int
    value_head_dim: int
    conv_kernel: int

    mamba_type = "gated_delta_net"

    def shapes(self, model: str, tp: int) -> tuple[tuple[int, ...], ...]:
        shard(model, "linear_num_key_heads", self.num_key_heads, tp)
        heads_v = shard(model, "linear_num_value_heads", self.num_value_heads, tp)
        conv_dim = 2 * self.num_key_heads * self.key_head_dim
        conv_dim += self.num_value_heads * self.value_head_dim
        return (
            (conv_dim // tp, self.conv_kernel - 1),
            (heads_v, self.value_head_dim, self.key_head_dim),
        )


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


LayerDesc = AttentionLayer | LatentLayer | StateLayer


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
            counts[layer.kind] = counts.get(layer.kind, 0) + 1
        return counts
