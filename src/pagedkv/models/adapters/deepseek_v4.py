"""DeepSeek-V4-style compressed attention, as vLLM 0.33's DeepSeek-V4.1 layers report it:
every layer keeps a sliding window of MLA latents; a layer with compress ratio ``r`` > 1
also keeps one latent per ``r`` tokens and a ring holding the group still being compressed."""

from __future__ import annotations

from pagedkv.errors import ModelConfigError
from pagedkv.models.adapters.common import decoder_layout
from pagedkv.models.adapters.dense import DecoderAdapter, optional_int
from pagedkv.models.layers import LatentLayer, ModelLayout, RingLayer, Unit
from pagedkv.models.source import ConfigView, ModelSource

__all__ = [
    "SWA_BLOCK_SIZE",
    "PAGE_ALIGNMENT",
    "RING_ROWS",
    "DeepseekV4Adapter",
]

# vLLM 0.33's DeepSeek-V4.1 cache shapes: the sliding-window cache's own block size, the
# page alignment of unpacked (bf16) latents, and the compressor ring's rows (drafts +
# bonus + the previous row, a power of two >= 8: 8 without speculative decoding).
SWA_BLOCK_SIZE = 32
PAGE_ALIGNMENT = 512
RING_ROWS = 8


class DeepseekV4Adapter(DecoderAdapter):
    """``head_dim`` values per latent, ``sliding_window`` tokens kept, and one
    ``compress_ratios`` entry per layer (0 or 1: sliding window only)."""

    def describe(self, view: ConfigView, source: ModelSource) -> ModelLayout:
        hidden = view.int("hidden_size")
        num_layers = view.int("num_hidden_layers")
        ratios = view.list("compress_ratios") or [0] * num_layers
        if len(ratios) < num_layers:
            raise ModelConfigError(
                f"{view.model}: config field 'compress_ratios' has {len(ratios)} entries "
                f"for {num_layers} layers"
            )
        attn = self.attention_params(view)
        units = []
        for index in range(num_layers):
            layers = self.cache_layers(view, index, int(ratios[index]))
            dense, experts = self.mlp_params(view, index)
            units.append(Unit(index, layers, attn + dense, experts))
        return decoder_layout(self, view, source, units, hidden, view.int("intermediate_size"))

    def cache_layers(
        self, view: ConfigView, index: int, ratio: int
    ) -> tuple[LatentLayer | RingLayer, ...]:
        heads, head = view.int("num_attention_heads"), view.int("head_dim")
        prefix = f"model.layers.{index}.attn"
        window = LatentLayer(
            f"{prefix}.swa_cache",
            heads,
            head,
            sliding_window=view.int("sliding_window"),
            block_size=SWA_BLOCK_SIZE,
            alignment=PAGE_ALIGNMENT,
            model_version="deepseek_v4",
        )
        if ratio <= 1:
            return (window,)
        compressed = LatentLayer(
            prefix,
            heads,
            head,
            tokens_per_state=ratio,
            alignment=PAGE_ALIGNMENT,
            model_version="deepseek_v4",
        )
        ring = RingLayer(f"{prefix}.compressor.state_cache", 1, 2 * head, RING_ROWS)
        return window, compressed, ring

    def attention_params(self, view: ConfigView) -> int:
        hidden, heads = view.int("hidden_size"), view.int("num_attention_heads")
        head = view.int("head_dim")
        q_rank = optional_int(view, "q_lora_rank")
        q = hidden * q_rank + q_rank * heads * head if q_rank else hidden * heads * head
        return q + hidden * head + heads * head * hidden

    def is_moe_layer(self, view: ConfigView, index: int) -> bool:
        return index >= optional_int(view, "first_k_dense_replace")
