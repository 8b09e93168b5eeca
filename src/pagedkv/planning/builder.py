"""The pluggable KV cache config builder and how the platform selects it."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Protocol, runtime_checkable

from pagedkv.config import EngineConfig, check_int
from pagedkv.errors import PlatformError
from pagedkv.planning.grouping import GroupingChoice, choose_kv_cache_groups
from pagedkv.planning.layout import is_block_outermost, resolve_kv_cache_layout
from pagedkv.planning.placement import bytes_per_block, place_groups
from pagedkv.planning.types import KVCacheConfig, KVCacheGroupSpec
from pagedkv.platforms import get_current_platform, resolve_obj_by_qualname
from pagedkv.specs.base import KVCacheSpec

__all__ = [
    "SupportsKVCacheGrouping",
    "KVCacheConfigBuilder",
    "DefaultKVCacheConfigBuilder",
    "VLLMRuleKVCacheConfigBuilder",
    "get_kv_cache_config_builder",
]


@runtime_checkable
class SupportsKVCacheGrouping(Protocol):
    """A model that decides its own KV cache groups (``ModelConfig.kv_cache_grouping``)."""

    def get_kv_cache_groups(
        self, config: EngineConfig, kv_cache_spec: Mapping[str, KVCacheSpec]
    ) -> Sequence[KVCacheGroupSpec]: ...


class KVCacheConfigBuilder(ABC):
    """Placement decisions for the planner: how layers form groups, and how groups
    become tensors for a given block count.

    The planner (``get_kv_cache_configs``) owns the cross-worker flow and checks
    whatever a builder returns: every layer in exactly one group, exactly
    ``num_blocks`` blocks, regions inside their tensors and aliasing only where
    block ids match. Subclass ``DefaultKVCacheConfigBuilder`` and override what you need.
    """

    @abstractmethod
    def get_kv_cache_groups(
        self, config: EngineConfig, kv_cache_spec: Mapping[str, KVCacheSpec]
    ) -> list[KVCacheGroupSpec]:
        """Split the layers into groups (planning passes all workers' layers)."""

    @abstractmethod
    def get_kv_cache_config_from_groups(
        self, config: EngineConfig, kv_cache_groups: Sequence[KVCacheGroupSpec], num_blocks: int
    ) -> KVCacheConfig:
        """Materialise the groups for exactly ``num_blocks`` blocks.

        Device tensors share one backing allocation of ``bytes_per_block * num_blocks``
        unless ``_get_pool_bytes_per_block`` is overridden; host-resident tensors are
        sized on their own and kept out of the device accounting.
        """

    def _get_pool_bytes_per_block(
        self, config: EngineConfig, kv_cache_groups: Sequence[KVCacheGroupSpec]
    ) -> int | None:
        """Device bytes one block id costs, or None to let the planner probe a
        one-block placement."""
        return None


class DefaultKVCacheConfigBuilder(KVCacheConfigBuilder):
    """The model's own grouping when it declares one, else the grouping rule the config
    names (``CacheConfig.kv_cache_grouping_rule``: vLLM's by default); layer-slot
    placement in one shared allocation."""

    # A grouping rule name that overrides the config's (None: the config's).
    grouping_rule: str | None = None

    def get_kv_cache_groups(
        self, config: EngineConfig, kv_cache_spec: Mapping[str, KVCacheSpec]
    ) -> list[KVCacheGroupSpec]:
        model_grouping = config.model.kv_cache_grouping
        if model_grouping is not None:
            if not isinstance(model_grouping, SupportsKVCacheGrouping):
                raise PlatformError(
                    "ModelConfig.kv_cache_grouping must have a "
                    f"get_kv_cache_groups(config, kv_cache_spec) method, got {model_grouping!r}"
                )
            return list(model_grouping.get_kv_cache_groups(config, kv_cache_spec))
        return list(self.choose_kv_cache_groups(config, kv_cache_spec).groups)

    def choose_kv_cache_groups(
        self, config: EngineConfig, kv_cache_spec: Mapping[str, KVCacheSpec]
    ) -> GroupingChoice:
        """The grouping rule's groups together with any alternatives it scored."""
        platform = get_current_platform()
        multiple = platform.kv_cache_block_size_multiple(config)
        check_int(
            platform.__qualname__, "kv_cache_block_size_multiple()", multiple, error=PlatformError
        )
        return choose_kv_cache_groups(
            config,
            kv_cache_spec,
            block_size_multiple=multiple,
            allow_hybrid=config.cache.enable_hybrid_kv_cache and platform.support_hybrid_kv_cache(),
            rule=self.grouping_rule,
        )

    def get_kv_cache_config_from_groups(
        self, config: EngineConfig, kv_cache_groups: Sequence[KVCacheGroupSpec], num_blocks: int
    ) -> KVCacheConfig:
        return place_groups(config, kv_cache_groups, num_blocks)

    def _get_pool_bytes_per_block(
        self, config: EngineConfig, kv_cache_groups: Sequence[KVCacheGroupSpec]
    ) -> int | None:
        layout = resolve_kv_cache_layout(config)
        return bytes_per_block(kv_cache_groups, block_outer=is_block_outermost(layout))


class VLLMRuleKVCacheConfigBuilder(DefaultKVCacheConfigBuilder):
    """The default builder held to vLLM's grouping whatever the config's rule."""

    grouping_rule = "vllm"


def get_kv_cache_config_builder(config: EngineConfig | None) -> KVCacheConfigBuilder:
    """A fresh instance of the builder the current platform selects for ``config``."""
    qualname = get_current_platform().get_kv_cache_config_builder_cls(config)
    builder_cls = resolve_obj_by_qualname(qualname)
    if not isinstance(builder_cls, type) or not issubclass(builder_cls, KVCacheConfigBuilder):
        raise PlatformError(
            f"KV cache config builder {qualname!r} is not a KVCacheConfigBuilder subclass"
        )
    return builder_cls()
