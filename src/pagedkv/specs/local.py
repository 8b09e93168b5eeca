"""Local attention: sliding window (plain and MLA) and chunked local attention."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from pagedkv.errors import KVCacheSpecError
from pagedkv.specs.base import (
    AttentionSpec,
    KVCacheSpec,
    all_match,
    cdiv,
    check_fields,
    pad_to_alignment,
)

__all__ = [
    "SlidingWindowSpec",
    "SlidingWindowMLASpec",
    "ChunkedLocalAttentionSpec",
]

if TYPE_CHECKING:
    from pagedkv.config import EngineConfig


def _admission_bytes(
    spec: SlidingWindowSpec | ChunkedLocalAttentionSpec, config: EngineConfig
) -> int:
    blocks = spec.max_admission_blocks_per_request(
        config.max_in_flight_tokens, config.max_model_len
    )
    return blocks * spec.page_size_bytes


@dataclass(frozen=True, kw_only=True)
class SlidingWindowSpec(AttentionSpec):
    """Each token attends to the last ``sliding_window`` tokens; older blocks are freed."""

    sliding_window: int
    # Trailing tokens kept alive (not attended) for multi-token speculative prefill.
    extra_retained_tokens: int = 0

    kind: ClassVar[str] = "sliding_window"

    def __post_init__(self) -> None:
        super().__post_init__()
        check_fields(self, "sliding_window")
        check_fields(self, "extra_retained_tokens", minimum=0)

    @property
    def num_retained_tokens(self) -> int:
        return self.sliding_window - 1 + self.extra_retained_tokens

    def max_admission_blocks_per_request(self, in_flight_tokens: int, max_model_len: int) -> int:
        """Blocks a request can hold at once; +1 because the window may start mid-block."""
        tokens = min(self.num_retained_tokens + in_flight_tokens, max_model_len)
        return cdiv(tokens, self.block_size) + 1

    def max_memory_usage_bytes(self, config: EngineConfig) -> int:
        return _admission_bytes(self, config)

    def is_uniform_with_collection(self, kv_cache_specs: Mapping[str, KVCacheSpec]) -> bool:
        return all_match(kv_cache_specs, SlidingWindowSpec, self, "sliding_window")


@dataclass(frozen=True, kw_only=True)
class SlidingWindowMLASpec(SlidingWindowSpec):
    """Sliding window over MLA latents (DeepSeek-V4's sliding-window layers).

    ``alignment`` pads the page up to a multiple of it; ``model_version`` is None or
    ``"deepseek_v4"``; with ``bounded_replay`` a hit replays the last ``sliding_window``
    tokens instead of reusing their blocks, so the group is not prefix-cached."""

    num_kv_heads: int = 1
    head_size_v: int | None = 0
    cache_dtype_str: str | None = None
    alignment: int | None = None
    model_version: str | None = None
    bounded_replay: bool = False

    kind: ClassVar[str] = "sliding_window_mla"

    def __post_init__(self) -> None:
        if self.model_version not in (None, "deepseek_v4"):
            raise KVCacheSpecError(
                f"SlidingWindowMLASpec.model_version must be None or 'deepseek_v4', "
                f"got {self.model_version!r}"
            )
        super().__post_init__()
        pad_to_alignment(self, self.alignment)

    @property
    def prefix_cacheable(self) -> bool:
        return not self.bounded_replay

    @property
    def prefix_replay_tokens(self) -> int:
        return self.sliding_window if self.bounded_replay else 0

    @property
    def disables_prefix_caching(self) -> bool:
        # A bounded-replay window only stays out of the cache (a hit replays it); the
        # model's other groups still cache, as in vLLM.
        return False

    def is_uniform_with_collection(self, kv_cache_specs: Mapping[str, KVCacheSpec]) -> bool:
        return all_match(
            kv_cache_specs, SlidingWindowMLASpec, self, "sliding_window", "bounded_replay"
        )


@dataclass(frozen=True, kw_only=True)
class ChunkedLocalAttentionSpec(AttentionSpec):
    """Tokens attend within their ``attention_chunk_size`` chunk only."""

    attention_chunk_size: int

    kind: ClassVar[str] = "chunked_local_attention"

    def __post_init__(self) -> None:
        super().__post_init__()
        check_fields(self, "attention_chunk_size")

    def max_admission_blocks_per_request(self, in_flight_tokens: int, max_model_len: int) -> int:
        tokens = min(self.attention_chunk_size + in_flight_tokens, max_model_len)
        return cdiv(tokens, self.block_size)

    def max_memory_usage_bytes(self, config: EngineConfig) -> int:
        return _admission_bytes(self, config)

    def is_uniform_with_collection(self, kv_cache_specs: Mapping[str, KVCacheSpec]) -> bool:
        return all_match(kv_cache_specs, ChunkedLocalAttentionSpec, self, "attention_chunk_size")
