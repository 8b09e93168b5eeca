"""Decoder-only attention models: full, sliding-window, interleaved and chunked-local layers."""

from __future__ import annotations

import dataclasses

from pagedkv.models.adapters import ModelAdapter
from pagedkv.models.adapters.common import (
    CHUNKED,
    FULL,
    SLIDING,
    MLPParams,
    attention_params,
    decoder_layout,
    gated_mlp_params,
    head_size,
    moe_params,
    normalize_layer_types,
    num_kv_heads,
)
from pagedkv.models.layers import AttentionLayer, ModelLayout, Unit
from pagedkv.models.source import ConfigView, ModelSource

__all__ = [
    "optional_int",
    "DecoderAdapter",
    "QwenAdapter",
    "Gemma2Adapter",
    "Gemma3Adapter",
    "Cohere2Adapter",
    "GptOssAdapter",
    "Llama4Adapter",
    "Gemma4Adapter",
]


def optional_int(view: ConfigView, *keys: str) -> int:
    """The first of ``keys`` that is set, as an int >= 0; 0 when none is."""
    for key in keys:
        if view.has(key):
            return view.int(key, minimum=0)
    return 0


class DecoderAdapter(ModelAdapter):
    """Llama-style decoder; a ``sliding_window`` without ``layer_types`` applies to every layer."""

    sinks = False
    tied_embeddings = False

    def describe(self, view: ConfigView, source: ModelSource) -> ModelLayout:
        num_layers = view.int("num_hidden_layers")
        kinds = normalize_layer_types(view, "layer_types", num_layers)
        if kinds is None:
            kinds = self.default_layer_kinds(view, num_layers)
        hidden = view.int("hidden_size")
        units = []
        for index, kind in enumerate(kinds):
            layer = self.attention_layer(view, index, kind)
            params, experts = self.mlp_params(view, index)
            attn = attention_params(hidden, layer.num_heads, layer.num_kv_heads, layer.head_size)
            units.append(Unit(index, (layer,), attn + params, experts))
        intermediate = view.int("intermediate_size", hidden * 4)
        return decoder_layout(self, view, source, units, hidden, intermediate, self.tied_embeddings)

    def default_layer_kinds(self, view: ConfigView, num_layers: int) -> list[str]:
        return [SLIDING if view.has("sliding_window") else FULL] * num_layers

    def attention_layer(self, view: ConfigView, index: int, kind: str) -> AttentionLayer:
        heads = view.int("num_attention_heads")
        return AttentionLayer(
            name=f"model.layers.{index}.self_attn",
            num_heads=heads,
            num_kv_heads=num_kv_heads(view, heads),
            head_size=head_size(view),
            sliding_window=view.int("sliding_window") if kind == SLIDING else None,
            chunk_size=view.int("attention_chunk_size") if kind == CHUNKED else None,
            sinks=self.sinks and kind != SLIDING,
        )

    def is_moe_layer(self, view: ConfigView, index: int) -> bool:
        if index < optional_int(view, "first_k_dense_replace"):
            return False
        if index in (view.list("mlp_only_layers") or []):
            return False
        step = optional_int(view, "decoder_sparse_step", "moe_layer_freq") or 1
        return (index + 1) % step == 0 if view.has("decoder_sparse_step") else index % step == 0

    def mlp_params(self, view: ConfigView, index: int) -> MLPParams:
        """(dense, expert) MLP parameters of layer ``index``."""
        hidden = view.int("hidden_size")
        experts = optional_int(view, "num_local_experts", "num_experts", "n_routed_experts")
        if not experts or not self.is_moe_layer(view, index):
            return MLPParams(gated_mlp_params(hidden, view.int("intermediate_size")), 0)
        expert_size = view.first_int("moe_intermediate_size", "intermediate_size")
        shared = optional_int(view, "shared_expert_intermediate_size")
        shared = shared or optional_int(view, "n_shared_experts") * expert_size
        return moe_params(hidden, experts, expert_size, shared)


class QwenAdapter(DecoderAdapter):
    """Qwen2/3: sliding window only with ``use_sliding_window``, from ``max_window_layers`` on."""

    def default_layer_kinds(self, view: ConfigView, num_layers: int) -> list[str]:
        if not view.get("use_sliding_window", False) or not view.has("sliding_window"):
            return [FULL] * num_layers
        first = optional_int(view, "max_window_layers")
        return [SLIDING if i >= first else FULL for i in range(num_layers)]


class Gemma2Adapter(DecoderAdapter):
    """Gemma 2: sliding and global layers alternate, sliding first."""

    tied_embeddings = True

    def default_layer_kinds(self, view: ConfigView, num_layers: int) -> list[str]:
        return [SLIDING if i % 2 == 0 else FULL for i in range(num_layers)]

    def mlp_params(self, view: ConfigView, index: int) -> MLPParams:
        return MLPParams(
            gated_mlp_params(view.int("hidden_size"), view.int("intermediate_size")), 0
        )


class Gemma3Adapter(Gemma2Adapter):
    """Gemma 3: every ``sliding_window_pattern``-th layer (default 6th) is global."""

    default_pattern = 6

    def default_layer_kinds(self, view: ConfigView, num_layers: int) -> list[str]:
        pattern = view.int("sliding_window_pattern", self.default_pattern)
        return [SLIDING if (i + 1) % pattern else FULL for i in range(num_layers)]


class Cohere2Adapter(Gemma3Adapter):
    """Command R7B / Command A: three sliding layers, then one global (pattern 4)."""

    default_pattern = 4

    def mlp_params(self, view: ConfigView, index: int) -> MLPParams:
        return DecoderAdapter.mlp_params(self, view, index)


class GptOssAdapter(DecoderAdapter):
    """gpt-oss: alternating sliding / full layers. Its learned attention sinks are one
    value per head in the kernel: vLLM's attention layer gives the full layers a plain
    ``FullAttentionSpec`` (``SinkFullAttentionSpec`` is for static sink tokens)."""

    def default_layer_kinds(self, view: ConfigView, num_layers: int) -> list[str]:
        return [SLIDING if i % 2 == 0 else FULL for i in range(num_layers)]


class Llama4Adapter(DecoderAdapter):
    """Llama 4: RoPE layers attend within ``attention_chunk_size`` chunks; NoPE layers are global.

    Without ``no_rope_layers`` every fourth layer is NoPE.
    """

    def default_layer_kinds(self, view: ConfigView, num_layers: int) -> list[str]:
        if not view.has("attention_chunk_size"):
            return [FULL] * num_layers
        flags = view.list("no_rope_layers") or [int((i + 1) % 4 != 0) for i in range(num_layers)]
        return [CHUNKED if flags[i] else FULL for i in range(num_layers)]

    def is_moe_layer(self, view: ConfigView, index: int) -> bool:
        step = view.int("interleave_moe_layer_step", 1)
        return (index + 1) % step == 0

    def mlp_params(self, view: ConfigView, index: int) -> MLPParams:
        hidden = view.int("hidden_size")
        expert_size = view.int("intermediate_size")
        if not self.is_moe_layer(view, index):
            return MLPParams(
                gated_mlp_params(hidden, view.int("intermediate_size_mlp", expert_size)), 0
            )
        return moe_params(hidden, view.int("num_local_experts"), expert_size, expert_size)


class Gemma4Adapter(DecoderAdapter):
    """Gemma 4: 5 sliding : 1 global (last layer always global); global layers use
    ``global_head_dim`` and, with ``attention_k_eq_v``, ``num_global_key_value_heads``.
    The last ``num_kv_shared_layers`` layers reuse earlier layers' KV and hold none."""

    tied_embeddings = True

    def default_layer_kinds(self, view: ConfigView, num_layers: int) -> list[str]:
        return [SLIDING if (i + 1) % 6 else FULL for i in range(num_layers)]

    def describe(self, view: ConfigView, source: ModelSource) -> ModelLayout:
        layout = super().describe(view, source)
        shared_from = len(layout.units) - optional_int(view, "num_kv_shared_layers")
        units = tuple(
            u if u.index < shared_from else Unit(u.index, (), u.params, u.expert_params)
            for u in layout.units
        )
        return dataclasses.replace(layout, units=units)

    def attention_layer(self, view: ConfigView, index: int, kind: str) -> AttentionLayer:
        if index == view.int("num_hidden_layers") - 1:
            kind = FULL
        layer = super().attention_layer(view, index, kind)
        if kind != FULL:
            return layer
        kv_heads = layer.num_kv_heads
        if view.get("attention_k_eq_v", True) and view.has("num_global_key_value_heads"):
            kv_heads = view.int("num_global_key_value_heads")
        return AttentionLayer(
            name=layer.name,
            num_heads=layer.num_heads,
            num_kv_heads=kv_heads,
            head_size=view.int("global_head_dim", 512),
        )

    def mlp_params(self, view: ConfigView, index: int) -> MLPParams:
        hidden = view.int("hidden_size")
        dense = gated_mlp_params(hidden, view.int("intermediate_size"))
        if not view.get("enable_moe_block", False):
            return MLPParams(dense, 0)
        router, experts = moe_params(
            hidden, view.int("num_experts"), view.int("moe_intermediate_size")
        )
        return MLPParams(dense + router, experts)
