"""Encoder-decoder models: decoder self-attention plus cross-attention to encoder outputs.

Encoder self-attention keeps nothing between steps, so it yields no spec.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import NamedTuple

from pagedkv.models.adapters import ModelAdapter
from pagedkv.models.adapters.common import (
    attention_params,
    build_layout,
    embedding_params,
    gated_mlp_params,
)
from pagedkv.models.layers import AttentionLayer, ModelLayout, Unit
from pagedkv.models.source import ConfigView, ModelSource

__all__ = [
    "EncoderDecoderDims",
    "MaxInputLengths",
    "EncoderDecoderAdapter",
    "T5Adapter",
    "BartAdapter",
    "WhisperAdapter",
]


class EncoderDecoderDims(NamedTuple):
    """An encoder-decoder model's sizes, as its config gives them."""

    hidden_size: int
    num_decoder_layers: int
    num_encoder_layers: int
    num_heads: int
    head_size: int
    intermediate_size: int  # the feed-forward width


class MaxInputLengths(NamedTuple):
    """The longest inputs, in tokens (audio frames for an audio encoder); None: unknown."""

    max_decoder_tokens: int | None
    max_encoder_tokens: int | None


class EncoderDecoderAdapter(ModelAdapter):
    """Subclasses say where the sizes live (``dims``) and how long inputs can be."""

    self_name = "model.decoder.layers.{}.self_attn"
    cross_name = "model.decoder.layers.{}.encoder_attn"
    tied_embeddings = True

    @abstractmethod
    def dims(self, view: ConfigView) -> EncoderDecoderDims:
        """The model's sizes."""

    def mlp_params(self, view: ConfigView, hidden: int, ffn: int) -> int:
        return 2 * hidden * ffn

    def lengths(self, view: ConfigView) -> MaxInputLengths:
        """The longest decoder and encoder inputs."""
        value = view.int("max_position_embeddings", 0, minimum=0) or None
        return MaxInputLengths(value, value)

    def describe(self, view: ConfigView, source: ModelSource) -> ModelLayout:
        hidden, dec_layers, enc_layers, heads, head, ffn = self.dims(view)
        attn = attention_params(hidden, heads, heads, head)
        mlp = self.mlp_params(view, hidden, ffn)
        units = []
        for index in range(dec_layers):
            self_attn = AttentionLayer(self.self_name.format(index), heads, heads, head)
            cross = AttentionLayer(self.cross_name.format(index), heads, heads, head, cross=True)
            units.append(Unit(index, (self_attn, cross), 2 * attn + mlp))
        embed, lm_head = embedding_params(view, source, hidden, self.tied_embeddings)
        max_len, max_encoder = self.lengths(view)
        return build_layout(
            self,
            view,
            source,
            units,
            hidden_size=hidden,
            intermediate_size=ffn,
            embedding_params=embed,
            head_params=lm_head,
            encoder_params=enc_layers * (attn + mlp),
            max_model_len=max_len,
            max_encoder_len=max_encoder,
        )


class T5Adapter(EncoderDecoderAdapter):
    self_name = "decoder.block.{}.layer.0.SelfAttention"
    cross_name = "decoder.block.{}.layer.1.EncDecAttention"

    def dims(self, view: ConfigView) -> EncoderDecoderDims:
        layers = view.int("num_layers")
        return EncoderDecoderDims(
            view.int("d_model"),
            view.int("num_decoder_layers", layers),
            layers,
            view.int("num_heads"),
            view.int("d_kv"),
            view.int("d_ff"),
        )

    def mlp_params(self, view: ConfigView, hidden: int, ffn: int) -> int:
        if "gated" in str(view.get("feed_forward_proj", "relu")):
            return gated_mlp_params(hidden, ffn)
        return 2 * hidden * ffn

    def lengths(self, view: ConfigView) -> MaxInputLengths:
        value = view.int("n_positions", 512)
        return MaxInputLengths(value, value)


class BartAdapter(EncoderDecoderAdapter):
    def dims(self, view: ConfigView) -> EncoderDecoderDims:
        hidden = view.int("d_model")
        heads = view.int("decoder_attention_heads")
        return EncoderDecoderDims(
            hidden,
            view.int("decoder_layers"),
            view.int("encoder_layers"),
            heads,
            hidden // heads,
            view.int("decoder_ffn_dim"),
        )


class WhisperAdapter(BartAdapter):
    """Whisper: the encoder sees at most ``max_source_positions`` (1500) audio frames."""

    def lengths(self, view: ConfigView) -> MaxInputLengths:
        return MaxInputLengths(view.int("max_target_positions"), view.int("max_source_positions"))
