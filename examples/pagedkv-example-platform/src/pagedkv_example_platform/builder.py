"""The example platform's builder: pagedkv's default grouping plus a tile check."""

from __future__ import annotations

from collections.abc import Mapping

from pagedkv.config import EngineConfig
from pagedkv.errors import PlanningError
from pagedkv.planning.builder import DefaultKVCacheConfigBuilder
from pagedkv.planning.types import KVCacheGroupSpec
from pagedkv.specs import KVCacheSpec, MambaSpec
from pagedkv_example_platform.platform import TILE_TOKENS


class ExampleKVCacheConfigBuilder(DefaultKVCacheConfigBuilder):
    """Groups layers like the default builder, then refuses block sizes the
    example kernels cannot tile."""

    def get_kv_cache_groups(
        self, config: EngineConfig, kv_cache_spec: Mapping[str, KVCacheSpec]
    ) -> list[KVCacheGroupSpec]:
        groups = super().get_kv_cache_groups(config, kv_cache_spec)
        for group_id, group in enumerate(groups):
            spec = group.kv_cache_spec
            if isinstance(spec, MambaSpec):
                continue  # one state per block: no token tiles
            if spec.block_size % TILE_TOKENS:
                raise PlanningError(
                    f"example platform: KV cache group {group_id} "
                    f"({group.layer_names[0]}, ...) has block size {spec.block_size}, "
                    f"not a multiple of the {TILE_TOKENS}-token tile; use --block-size "
                    f"{TILE_TOKENS} or a multiple"
                )
        return groups
