"""Encoder-side attention: cross attention (sized once) and encoder-only (no cache)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from pagedkv.specs.base import AttentionSpec, cdiv

__all__ = [
    "CrossAttentionSpec",
    "EncoderOnlyAttentionSpec",
]

if TYPE_CHECKING:
    from pagedkv.config import EngineConfig


@dataclass(frozen=True, kw_only=True)
class CrossAttentionSpec(AttentionSpec):
    """Decoder layers attending to encoder outputs: sized from encoder tokens, never cached."""

    kind: ClassVar[str] = "cross_attention"

    @property
    def prefix_cacheable(self) -> bool:
        return False

    def max_memory_usage_bytes(self, config: EngineConfig) -> int:
        return cdiv(config.max_num_encoder_input_tokens, self.block_size) * self.page_size_bytes

    def max_num_blocks_per_req(self, config: EngineConfig, max_model_len: int | None = None) -> int:
        return cdiv(config.max_num_encoder_input_tokens, self.block_size)


@dataclass(frozen=True, kw_only=True)
class EncoderOnlyAttentionSpec(AttentionSpec):
    """Encoder self-attention keeps nothing between steps (unregistered on purpose)."""

    kind: ClassVar[str] = "encoder_only_attention"

    @property
    def prefix_cacheable(self) -> bool:
        return False

    def max_memory_usage_bytes(self, config: EngineConfig) -> int:
        return 0
