"""A per-request ring buffer: one block, reused in place, for the life of the request."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from pagedkv.specs.base import AttentionSpec, KVCacheSpec

__all__ = [
    "CircularBufferSpec",
]

if TYPE_CHECKING:
    from pagedkv.config import EngineConfig


@dataclass(frozen=True, kw_only=True)
class CircularBufferSpec(AttentionSpec):
    """Raw keys of the token group a compressing layer has not compressed yet (DeepSeek-V4's
    compressor, GLM-5-next's indexer tail). ``block_size`` is the ring's capacity in tokens;
    the request owns exactly one block, whatever its length, and it is never cached."""

    kind: ClassVar[str] = "circular_buffer"

    @property
    def vllm_kind(self) -> str:
        return "unknown"

    @property
    def prefix_cacheable(self) -> bool:
        return False

    @property
    def disables_prefix_caching(self) -> bool:
        # The ring only stays out of the cache; the model's other groups still cache.
        return False

    def max_memory_usage_bytes(self, config: EngineConfig) -> int:
        return self.page_size_bytes

    def max_num_blocks_per_req(self, config: EngineConfig, max_model_len: int | None = None) -> int:
        return 1

    def is_uniform_with_collection(self, kv_cache_specs: Mapping[str, KVCacheSpec]) -> bool:
        return all(isinstance(s, CircularBufferSpec) for s in kv_cache_specs.values())
