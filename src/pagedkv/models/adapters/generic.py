"""The reading used when no family adapter matches: a plain attention decoder.

A config with ``num_hidden_layers``, ``num_attention_heads`` and ``hidden_size``, whose
layer kinds come from ``layer_types`` (full / sliding / chunked) or from one
``sliding_window`` for every layer, is read like a Llama-style decoder. A config that
names state layers (Mamba, linear attention) or a per-layer pattern this reading does
not know is refused with the field at fault: those need a family adapter.
"""

from __future__ import annotations

from pagedkv.errors import ModelConfigError
from pagedkv.models.adapters.common import FULL, LINEAR, MLP, MLPParams
from pagedkv.models.adapters.dense import DecoderAdapter
from pagedkv.models.layers import AttentionLayer, ModelLayout
from pagedkv.models.source import ConfigView, ModelSource

__all__ = ["GenericDecoderAdapter"]

REQUIRED_FIELDS = ("num_hidden_layers", "num_attention_heads", "hidden_size")
# fields that announce state layers the generic reading cannot size
STATE_FIELDS = (
    "layers_block_type",
    "hybrid_override_pattern",
    "attn_layer_indices",
    "mamba_d_state",
    "ssm_state_size",
    "state_size",
    "linear_num_value_heads",
    "attn_type_list",
)


class GenericDecoderAdapter(DecoderAdapter):
    """Reads any attention-only decoder config (see the module docstring)."""

    def describe(self, view: ConfigView, source: ModelSource) -> ModelLayout:
        label = source.architecture or source.model_type or "none given"
        missing = [f for f in REQUIRED_FIELDS if not view.has(f)]
        if missing:
            raise ModelConfigError(
                f"{source.name}: unknown architecture {label!r} (field 'architectures' / "
                f"'model_type'), and the generic decoder reading needs config field(s) "
                f"{', '.join(missing)}; register an adapter with "
                "pagedkv.models.register_model_adapter"
            )
        state = [f for f in STATE_FIELDS if view.has(f)]
        if state:
            raise ModelConfigError(
                f"{source.name}: no adapter for {label!r}; its config names state layers "
                f"({', '.join(state)}) that the generic decoder reading cannot size: "
                "register an adapter with pagedkv.models.register_model_adapter"
            )
        return super().describe(view, source)

    def default_layer_kinds(self, view: ConfigView, num_layers: int) -> list[str]:
        kinds = super().default_layer_kinds(view, num_layers)
        if view.get("sliding_window") is None:
            return [FULL] * num_layers
        return kinds

    def mlp_params(self, view: ConfigView, index: int) -> MLPParams:
        if not view.has("intermediate_size"):  # Falcon, GPT-2 style: 4x hidden
            hidden = view.int("hidden_size")
            return MLPParams(2 * hidden * 4 * hidden, 0)
        return super().mlp_params(view, index)

    def attention_layer(self, view: ConfigView, index: int, kind: str) -> AttentionLayer:
        if kind in (LINEAR, MLP):
            raise ModelConfigError(
                f"{view.model}: layer {index} is a {kind!r} layer, which the generic decoder "
                "reading cannot size: register an adapter with "
                "pagedkv.models.register_model_adapter"
            )
        return super().attention_layer(view, index, kind)
