"""Models in the ``mamba_ssm`` package's own config format (d_model, n_layer, ssm_cfg)."""

from __future__ import annotations

from pagedkv.models.adapters import ModelAdapter
from pagedkv.models.adapters.common import (
    attention_params,
    build_layout,
    gated_mlp_params,
    mamba1_params,
    mamba2_params,
)
from pagedkv.models.layers import (
    AttentionLayer,
    LayerDesc,
    ModelLayout,
    StateLayer,
    StateShape,
    Unit,
)
from pagedkv.models.source import ConfigView, ModelSource
from pagedkv.models.states import Mamba1State, Mamba2State

__all__ = [
    "MAMBA2_DEFAULTS",
    "MAMBA1_DEFAULTS",
    "MambaSSMAdapter",
]

# mamba_ssm's constructor defaults, used when ssm_cfg leaves a field out.
MAMBA2_DEFAULTS = {"d_state": 128, "d_conv": 4, "expand": 2, "headdim": 64, "ngroups": 1}
MAMBA1_DEFAULTS = {"d_state": 16, "d_conv": 4, "expand": 2}


class MambaSSMAdapter(ModelAdapter):
    """Pure Mamba-1/2 (``ssm_cfg.layer``), with attention at ``attn_layer_idx`` if any."""

    def state(self, view: ConfigView, hidden: int) -> StateShape:
        cfg = view.sub("ssm_cfg")
        if cfg.get("layer", "Mamba1") == "Mamba2":
            d = MAMBA2_DEFAULTS
            inner = cfg.int("expand", d["expand"]) * hidden
            head_dim = cfg.int("headdim", d["headdim"])
            return Mamba2State(
                inner,
                inner // head_dim,
                head_dim,
                cfg.int("ngroups", d["ngroups"]),
                cfg.int("d_state", d["d_state"]),
                cfg.int("d_conv", d["d_conv"]),
            )
        d = MAMBA1_DEFAULTS
        return Mamba1State(
            cfg.int("expand", d["expand"]) * hidden,
            cfg.int("d_state", d["d_state"]),
            cfg.int("d_conv", d["d_conv"]),
        )

    def attention(self, view: ConfigView, index: int, hidden: int) -> AttentionLayer:
        cfg = view.sub("attn_cfg")
        heads = cfg.int("num_heads")
        size = cfg.int("head_dim", hidden // heads)
        return AttentionLayer(
            f"backbone.layers.{index}.mixer", heads, cfg.int("num_heads_kv", heads), size
        )

    def describe(self, view: ConfigView, source: ModelSource) -> ModelLayout:
        hidden = view.int("d_model")
        state = self.state(view, hidden)
        if isinstance(state, Mamba2State):
            mixer = mamba2_params(hidden, state)
        else:
            assert isinstance(state, Mamba1State)
            mixer = mamba1_params(hidden, state, -(-hidden // 16))
        mlp = gated_mlp_params(hidden, view.int("d_intermediate", 0, minimum=0))
        attn_idx = set(view.list("attn_layer_idx") or [])
        units = []
        for index in range(view.int("n_layer")):
            layer: LayerDesc
            if index in attn_idx:
                layer = self.attention(view, index, hidden)
                params = attention_params(
                    hidden, layer.num_heads, layer.num_kv_heads, layer.head_size
                )
            else:
                layer = StateLayer(f"backbone.layers.{index}.mixer", state)
                params = mixer
            units.append(Unit(index, (layer,), params + mlp))
        multiple = view.int("pad_vocab_size_multiple", 1)
        vocab = -(-view.int("vocab_size") // multiple) * multiple
        tied = view.get("tie_embeddings", True)
        return build_layout(
            self,
            view,
            source,
            units,
            hidden_size=hidden,
            intermediate_size=view.int("d_intermediate", 0, minimum=0),
            embedding_params=vocab * hidden,
            head_params=0 if tied else vocab * hidden,
            max_model_len=None,
        )
