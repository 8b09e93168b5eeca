"""A group-level spec over layers of one kind whose pages differ in size."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from pagedkv.errors import KVCacheSpecError
from pagedkv.registry import KVCacheSpecRegistry
from pagedkv.specs.base import KVCacheSpec

__all__ = [
    "UniformTypeKVCacheSpecs",
]

if TYPE_CHECKING:
    from pagedkv.config import EngineConfig


@dataclass(frozen=True, kw_only=True, eq=False)
class UniformTypeKVCacheSpecs(KVCacheSpec):
    """Layers of one kind sharing one block table; one block id costs the sum of their pages."""

    kv_cache_specs: Mapping[str, KVCacheSpec] = field(default_factory=dict)

    kind: ClassVar[str] = "uniform_type"

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "kv_cache_specs", dict(self.kv_cache_specs))
        if not self.kv_cache_specs:
            raise KVCacheSpecError("UniformTypeKVCacheSpecs needs at least one layer")
        sizes = {s.block_size for s in self.kv_cache_specs.values()}
        if sizes != {self.block_size}:
            raise KVCacheSpecError(
                f"UniformTypeKVCacheSpecs: layers have block sizes {sorted(sizes)}, "
                f"expected all {self.block_size}"
            )

    def _key(self) -> tuple[Any, ...]:
        return (self.block_size, tuple(self.kv_cache_specs.items()))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, UniformTypeKVCacheSpecs):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    @property
    def first_spec(self) -> KVCacheSpec:
        return next(iter(self.kv_cache_specs.values()))

    @property
    def page_size_bytes(self) -> int:
        return sum(s.page_size_bytes for s in self.kv_cache_specs.values())

    @property
    def real_page_size_bytes(self) -> int:
        return sum(s.real_page_size_bytes for s in self.kv_cache_specs.values())

    @property
    def prefix_cacheable(self) -> bool:
        return all(s.prefix_cacheable for s in self.kv_cache_specs.values())

    @property
    def prefix_replay_tokens(self) -> int:
        return max((s.prefix_replay_tokens for s in self.kv_cache_specs.values()), default=0)

    def max_memory_usage_bytes(self, config: EngineConfig) -> int:
        return self.max_memory_usage_blocks(config) * self.page_size_bytes

    def max_memory_usage_blocks(self, config: EngineConfig) -> int:
        return max(s.max_memory_usage_blocks(config) for s in self.kv_cache_specs.values())

    def max_num_blocks_per_req(self, config: EngineConfig, max_model_len: int | None = None) -> int:
        counts = {
            s.max_num_blocks_per_req(config, max_model_len) for s in self.kv_cache_specs.values()
        }
        if len(counts) > 1:
            raise KVCacheSpecError(
                "all layers of one KV cache group must need the same number of block-table "
                f"entries, got {sorted(counts)}"
            )
        return counts.pop()

    def copy_with_new_block_size(self, block_size: int) -> UniformTypeKVCacheSpecs:
        return UniformTypeKVCacheSpecs(
            block_size=block_size,
            kv_cache_specs={
                name: s.copy_with_new_block_size(block_size)
                for name, s in self.kv_cache_specs.items()
            },
        )

    @classmethod
    def is_uniform_type(cls, kv_cache_specs: Mapping[str, KVCacheSpec]) -> bool:
        """Whether the layers can share one group. Unlike vLLM's, independent of order:
        every spec must accept the collection, and all resolve to one manager class."""
        specs = list(kv_cache_specs.values())
        if not specs or len({s.block_size for s in specs}) > 1:
            return False
        if not all(s.is_uniform_with_collection(kv_cache_specs) for s in specs):
            return False
        managers = {KVCacheSpecRegistry.get_manager_class(s) for s in specs}
        return len(managers) == 1

    @classmethod
    def from_specs(
        cls, kv_cache_specs: Mapping[str, KVCacheSpec]
    ) -> UniformTypeKVCacheSpecs | None:
        if not cls.is_uniform_type(kv_cache_specs):
            return None
        first = next(iter(kv_cache_specs.values()))
        return cls(block_size=first.block_size, kv_cache_specs=kv_cache_specs)
