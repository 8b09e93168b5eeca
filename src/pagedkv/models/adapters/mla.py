"""Multi-head latent attention (DeepSeek-V2/V3, Kimi-K2, GLM-5): one latent per token."""

from __future__ import annotations

from pagedkv.models.adapters.common import decoder_layout
from pagedkv.models.adapters.dense import DecoderAdapter, optional_int
from pagedkv.models.layers import LatentLayer, ModelLayout, Unit
from pagedkv.models.source import ConfigView, ModelSource

__all__ = [
    "INDEXER_QUANT_BLOCK",
    "mla_params",
    "indexer_params",
    "MLAAdapter",
]

# A sparse-attention indexer key is stored as fp8 with one fp32 scale per 128 values.
INDEXER_QUANT_BLOCK = 128


def mla_params(view: ConfigView) -> int:
    hidden = view.int("hidden_size")
    heads = view.int("num_attention_heads")
    latent = view.int("kv_lora_rank")
    rope = view.int("qk_rope_head_dim")
    nope = view.int("qk_nope_head_dim")
    v_head = view.int("v_head_dim")
    q_rank = optional_int(view, "q_lora_rank")
    q_out = heads * (nope + rope)
    q = hidden * q_rank + q_rank * q_out if q_rank else hidden * q_out
    kv = hidden * (latent + rope) + latent * heads * (nope + v_head)
    return q + kv + heads * v_head * hidden


def indexer_params(view: ConfigView) -> int:
    hidden = view.int("hidden_size")
    heads = view.int("index_n_heads")
    head = view.int("index_head_dim")
    q_rank = optional_int(view, "q_lora_rank") or hidden
    return q_rank * heads * head + hidden * head + hidden * heads


class MLAAdapter(DecoderAdapter):
    """Every layer caches ``kv_lora_rank + qk_rope_head_dim`` values per token, shared by
    all heads (so tensor parallelism replicates it). With ``index_topk`` (DeepSeek-V3.2,
    GLM-5 sparse attention) each layer also caches an indexer key."""

    def describe(self, view: ConfigView, source: ModelSource) -> ModelLayout:
        hidden = view.int("hidden_size")
        heads = view.int("num_attention_heads")
        latent = view.int("kv_lora_rank") + view.int("qk_rope_head_dim")
        attn = mla_params(view)
        sparse = view.has("index_topk")
        if sparse:
            attn += indexer_params(view)
        units = []
        for index in range(view.int("num_hidden_layers")):
            layers: list[LatentLayer] = [
                LatentLayer(f"model.layers.{index}.self_attn", heads, latent)
            ]
            if sparse:
                layers.append(self.indexer_layer(view, index))
            dense, experts = self.mlp_params(view, index)
            units.append(Unit(index, tuple(layers), attn + dense, experts))
        return decoder_layout(self, view, source, units, hidden, view.int("intermediate_size"))

    def indexer_layer(self, view: ConfigView, index: int) -> LatentLayer:
        head = view.int("index_head_dim")
        packed = head + head // INDEXER_QUANT_BLOCK * 4
        return LatentLayer(f"model.layers.{index}.self_attn.indexer", 1, packed, dtype="uint8")

    def is_moe_layer(self, view: ConfigView, index: int) -> bool:
        if index < optional_int(view, "first_k_dense_replace"):
            return False
        return index % view.int("moe_layer_freq", 1) == 0
