"""Full attention and the kinds that size like it: MLA and attention sinks."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Self

from pagedkv.errors import KVCacheSpecError
from pagedkv.specs.base import (
    AttentionSpec,
    KVCacheSpec,
    cdiv,
    check_fields,
    merge_checked,
    pad_to_alignment,
)

__all__ = [
    "merge_window_sizes",
    "FullAttentionSpec",
    "MLAAttentionSpec",
    "SinkFullAttentionSpec",
]

if TYPE_CHECKING:
    from pagedkv.config import EngineConfig


def merge_window_sizes(values: set[int]) -> int | None:
    if len(values) > 1:
        raise KVCacheSpecError(
            f"all attention layers in one KV cache group must have the same window, "
            f"got {sorted(values)}"
        )
    return next(iter(values), None)


@dataclass(frozen=True, kw_only=True)
class FullAttentionSpec(AttentionSpec):
    """Every token stays for the life of the request (``sliding_window`` /
    ``attention_chunk_size`` only record a promoted local layer)."""

    sliding_window: int | None = None
    attention_chunk_size: int | None = None

    kind: ClassVar[str] = "full_attention"

    def __post_init__(self) -> None:
        super().__post_init__()
        check_fields(self, "sliding_window", "attention_chunk_size", allow_none=True)
        if self.sliding_window is not None and self.attention_chunk_size is not None:
            raise KVCacheSpecError(
                f"{type(self).__name__}: a layer cannot have both sliding_window and "
                "attention_chunk_size"
            )

    def max_memory_usage_bytes(self, config: EngineConfig) -> int:
        return cdiv(config.max_model_len, self.block_size) * self.page_size_bytes

    @classmethod
    def merge(cls, specs: Sequence[KVCacheSpec]) -> Self:
        """Merge layers that differ only in promoted window / chunk metadata."""
        merge_checked(cls, specs, reconciled=("sliding_window", "attention_chunk_size"))
        full = [s for s in specs if isinstance(s, FullAttentionSpec)]
        window = merge_window_sizes({s.sliding_window for s in full if s.sliding_window})
        chunk = merge_window_sizes({s.attention_chunk_size for s in full if s.attention_chunk_size})
        if window is not None and chunk is not None:
            raise KVCacheSpecError(
                "a KV cache group cannot mix sliding-window and chunked-local layers"
            )
        first: FullAttentionSpec = full[0]
        return dataclasses.replace(  # type: ignore[return-value]
            first, sliding_window=window, attention_chunk_size=chunk
        )


@dataclass(frozen=True, kw_only=True)
class MLAAttentionSpec(FullAttentionSpec):
    """Multi-head latent attention: one compressed latent per token, no separate V.
    DeepSeek-V4 also sets ``alignment`` (the page is padded up to a multiple of it),
    ``model_version`` and ``tokens_per_state`` (its compression ratio)."""

    num_kv_heads: int = 1
    head_size_v: int | None = 0
    cache_dtype_str: str | None = None
    alignment: int | None = None
    model_version: str | None = None

    kind: ClassVar[str] = "mla_attention"

    def __post_init__(self) -> None:
        super().__post_init__()
        pad_to_alignment(self, self.alignment)


@dataclass(frozen=True, kw_only=True)
class SinkFullAttentionSpec(FullAttentionSpec):
    """Full attention with ``sink_len`` learned sink tokens kept in front of every request."""

    sink_len: int | None = None

    kind: ClassVar[str] = "sink_full_attention"

    def __post_init__(self) -> None:
        super().__post_init__()
        check_fields(self, "sink_len", allow_none=True)
