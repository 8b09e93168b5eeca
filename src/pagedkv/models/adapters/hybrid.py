"""Mamba and linear-attention models, pure or interleaved with attention layers."""

from __future__ import annotations

from abc import abstractmethod

from pagedkv.errors import ModelConfigError
from pagedkv.models.adapters import ModelAdapter
from pagedkv.models.adapters.common import (
    FULL,
    LINEAR,
    MLP,
    MLPParams,
    attention_params,
    decoder_layout,
    gated_mlp_params,
    gdn_params,
    head_size,
    mamba1_params,
    mamba2_params,
    moe_params,
    normalize_layer_types,
    num_kv_heads,
)
from pagedkv.models.adapters.dense import optional_int
from pagedkv.models.layers import (
    AttentionLayer,
    LayerDesc,
    ModelLayout,
    StateLayer,
    StateShape,
    Unit,
)
from pagedkv.models.source import ConfigView, ModelSource
from pagedkv.models.states import GatedDeltaNetState, Mamba1State, Mamba2State

__all__ = [
    "ssm_dtype",
    "HybridAdapter",
    "JambaAdapter",
    "NemotronHAdapter",
    "GraniteHybridAdapter",
    "GatedDeltaNetAdapter",
    "Mamba2Adapter",
]


def ssm_dtype(view: ConfigView) -> str | None:
    """The recurrent-state dtype the published config asks for, if any."""
    for key in ("mamba_ssm_dtype", "mamba_ssm_cache_dtype"):
        value = view.published.get(key)
        if isinstance(value, str) and value != "auto":
            return value
    return None


class HybridAdapter(ModelAdapter):
    """Shared walk: ``layer_kinds`` says which layers are attention, state or MLP-only."""

    def layer_kinds(self, view: ConfigView, num_layers: int) -> list[str]:
        kinds = normalize_layer_types(view, "layer_types", num_layers)
        if kinds is None:
            raise ModelConfigError(f"{view.model}: config field 'layer_types' is missing")
        return kinds

    @abstractmethod
    def state(self, view: ConfigView) -> StateShape:
        """The recurrent state every state layer of this model holds."""

    def state_params(self, view: ConfigView, state: StateShape) -> int:
        assert isinstance(state, Mamba2State)
        return mamba2_params(view.int("hidden_size"), state)

    def attention(self, view: ConfigView, index: int) -> AttentionLayer:
        heads = view.int("num_attention_heads")
        return AttentionLayer(
            f"model.layers.{index}.self_attn",
            heads,
            num_kv_heads(view, heads),
            head_size(view),
        )

    def mlp_params(self, view: ConfigView, index: int, kind: str) -> MLPParams:
        size = view.int("intermediate_size", 0, minimum=0)
        return MLPParams(gated_mlp_params(view.int("hidden_size"), size), 0)

    def describe(self, view: ConfigView, source: ModelSource) -> ModelLayout:
        hidden = view.int("hidden_size")
        num_layers = view.int("num_hidden_layers")
        state = self.state(view)
        state_params = self.state_params(view, state)
        units = []
        for index, kind in enumerate(self.layer_kinds(view, num_layers)):
            layers: tuple[LayerDesc, ...] = ()
            params, experts = self.mlp_params(view, index, kind)
            if kind == LINEAR:
                layers = (StateLayer(f"model.layers.{index}.mixer", state, ssm_dtype(view)),)
                params += state_params
            elif kind == FULL:
                attn = self.attention(view, index)
                layers = (attn,)
                params += attention_params(
                    hidden, attn.num_heads, attn.num_kv_heads, attn.head_size
                )
            elif kind != MLP:
                raise ModelConfigError(f"{view.model}: layer {index} has unsupported type {kind!r}")
            units.append(Unit(index, layers, params, experts))
        intermediate = view.int("intermediate_size", hidden * 4, minimum=0)
        return decoder_layout(self, view, source, units, hidden, intermediate)


class JambaAdapter(HybridAdapter):
    """Jamba: Mamba-1 layers with attention every ``attn_layer_period`` layers."""

    def layer_kinds(self, view: ConfigView, num_layers: int) -> list[str]:
        kinds = normalize_layer_types(view, "layers_block_type", num_layers)
        if kinds is not None:
            return kinds
        period = view.int("attn_layer_period")
        offset = view.int("attn_layer_offset", minimum=0)
        return [FULL if i % period == offset else LINEAR for i in range(num_layers)]

    def state(self, view: ConfigView) -> StateShape:
        return Mamba1State(
            view.int("mamba_expand") * view.int("hidden_size"),
            view.int("mamba_d_state"),
            view.int("mamba_d_conv"),
        )

    def state_params(self, view: ConfigView, state: StateShape) -> int:
        assert isinstance(state, Mamba1State)
        # "auto" (JambaConfig's default) is ceil(hidden_size / 16).
        auto = -(-view.int("hidden_size") // 16)
        dt_rank = auto if view.get("mamba_dt_rank") == "auto" else view.int("mamba_dt_rank", auto)
        return mamba1_params(view.int("hidden_size"), state, dt_rank)

    def mlp_params(self, view: ConfigView, index: int, kind: str) -> MLPParams:
        hidden, size = view.int("hidden_size"), view.int("intermediate_size")
        experts = optional_int(view, "num_experts")
        period = view.int("expert_layer_period", 1)
        if experts > 1 and index % period == view.int("expert_layer_offset", 0, minimum=0):
            return moe_params(hidden, experts, size)
        return MLPParams(gated_mlp_params(hidden, size), 0)


class NemotronHAdapter(HybridAdapter):
    """Nemotron-H: ``hybrid_override_pattern`` (M = Mamba-2, * = attention, - = MLP, E = MoE)."""

    _PATTERN = {"M": LINEAR, "*": FULL, "-": MLP, "E": MLP}

    def layer_kinds(self, view: ConfigView, num_layers: int) -> list[str]:
        pattern = view.get("hybrid_override_pattern")
        if pattern is None:
            kinds = normalize_layer_types(view, "layers_block_type", num_layers)
            if kinds is None:
                raise ModelConfigError(
                    f"{view.model}: config field 'hybrid_override_pattern' is missing"
                )
            return kinds
        if len(pattern) != num_layers or any(c not in self._PATTERN for c in pattern):
            raise ModelConfigError(
                f"{view.model}: config field 'hybrid_override_pattern' must have "
                f"{num_layers} characters from M * - E, got {pattern!r}"
            )
        return [self._PATTERN[c] for c in pattern]

    def state(self, view: ConfigView) -> StateShape:
        heads, head_dim = view.int("mamba_num_heads"), view.int("mamba_head_dim")
        return Mamba2State(
            heads * head_dim,
            heads,
            head_dim,
            view.int("n_groups"),
            view.int("ssm_state_size"),
            view.int("conv_kernel"),
        )

    def attention(self, view: ConfigView, index: int) -> AttentionLayer:
        layer = super().attention(view, index)
        size = view.first_int("attention_head_dim", "head_dim", default=layer.head_size)
        return AttentionLayer(layer.name, layer.num_heads, layer.num_kv_heads, size)

    def mlp_params(self, view: ConfigView, index: int, kind: str) -> MLPParams:
        if kind != MLP:
            return MLPParams(0, 0)
        # Nemotron-H MLP layers are plain up/down projections (squared ReLU, no gate).
        return MLPParams(2 * view.int("hidden_size") * view.int("intermediate_size"), 0)


class GraniteHybridAdapter(HybridAdapter):
    """Granite 4.0-H: Mamba-2 and attention layers named in ``layer_types``."""

    def state(self, view: ConfigView) -> StateShape:
        heads = view.int("mamba_n_heads")
        if view.get("mamba_d_head") == "auto":  # GraniteMoeHybridConfig: expand x hidden / heads
            head_dim = view.int("mamba_expand") * view.int("hidden_size") // heads
        else:
            head_dim = view.int("mamba_d_head")
        return Mamba2State(
            heads * head_dim,
            heads,
            head_dim,
            view.int("mamba_n_groups"),
            view.int("mamba_d_state"),
            view.int("mamba_d_conv"),
        )

    def mlp_params(self, view: ConfigView, index: int, kind: str) -> MLPParams:
        hidden = view.int("hidden_size")
        shared = view.int("shared_intermediate_size", 0, minimum=0)
        experts = optional_int(view, "num_local_experts")
        if not experts:
            return MLPParams(gated_mlp_params(hidden, shared or view.int("intermediate_size")), 0)
        return moe_params(hidden, experts, view.int("intermediate_size"), shared)


class GatedDeltaNetAdapter(HybridAdapter):
    """Qwen3-Next / Qwen3.5: gated DeltaNet layers, every ``full_attention_interval``-th
    layer (default 4th) full attention."""

    def layer_kinds(self, view: ConfigView, num_layers: int) -> list[str]:
        kinds = normalize_layer_types(view, "layer_types", num_layers)
        if kinds is not None:
            return kinds
        interval = view.int("full_attention_interval", 4)
        return [FULL if (i + 1) % interval == 0 else LINEAR for i in range(num_layers)]

    def state(self, view: ConfigView) -> StateShape:
        return GatedDeltaNetState(
            view.int("linear_num_key_heads"),
            view.int("linear_num_value_heads"),
            view.int("linear_key_head_dim"),
            view.int("linear_value_head_dim"),
            view.int("linear_conv_kernel_dim"),
        )

    def state_params(self, view: ConfigView, state: StateShape) -> int:
        assert isinstance(state, GatedDeltaNetState)
        return gdn_params(view.int("hidden_size"), state)

    def mlp_params(self, view: ConfigView, index: int, kind: str) -> MLPParams:
        hidden = view.int("hidden_size")
        experts = optional_int(view, "num_experts")
        if not experts or index in (view.list("mlp_only_layers") or []):
            return MLPParams(gated_mlp_params(hidden, view.int("intermediate_size")), 0)
        return moe_params(
            hidden,
            experts,
            view.int("moe_intermediate_size"),
            optional_int(view, "shared_expert_intermediate_size"),
        )


class Mamba2Adapter(HybridAdapter):
    """Pure Mamba-2 in transformers' format."""

    def layer_kinds(self, view: ConfigView, num_layers: int) -> list[str]:
        return [LINEAR] * num_layers

    def state(self, view: ConfigView) -> StateShape:
        heads, head_dim = view.int("num_heads"), view.int("head_dim")
        return Mamba2State(
            view.int("expand") * view.int("hidden_size"),
            heads,
            head_dim,
            view.int("n_groups", 1),
            view.int("state_size"),
            view.int("conv_kernel", 4),
        )

    def mlp_params(self, view: ConfigView, index: int, kind: str) -> MLPParams:
        return MLPParams(0, 0)
