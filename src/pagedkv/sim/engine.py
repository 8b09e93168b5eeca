"""What a simulation runs on: a planned KV cache config and the engine options."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from pagedkv.config import EngineConfig
from pagedkv.planning.types import KVCacheConfig
from pagedkv.sim.scheduler import SchedulerSettings, Simulator
from pagedkv.specs import FullAttentionSpec, KVCacheSpec, UniformTypeKVCacheSpecs


def _behaviour_spec(spec: KVCacheSpec) -> KVCacheSpec:
    return spec.first_spec if isinstance(spec, UniformTypeKVCacheSpecs) else spec


def _group_label(group: Any) -> str:
    spec = group.kv_cache_spec
    return f"{type(spec).__name__}x{len(group.layer_names)}"


def bound_geometry(kv_cache_config: KVCacheConfig) -> tuple[int, int] | None:
    """(block size, capacity in blocks) for the clairvoyant bound, or None without a
    full-attention group (a window hit does not need the whole prefix, so no chain bound).

    Every full-attention group stores each cached token block once, so the pool holds at
    most ``(num_blocks - 1) // num_full_groups`` of them.
    """
    specs = [_behaviour_spec(g.kv_cache_spec) for g in kv_cache_config.kv_cache_groups]
    full = [spec for spec in specs if isinstance(spec, FullAttentionSpec)]
    if not full:
        return None
    return full[0].block_size, (kv_cache_config.num_blocks - 1) // len(full)


@dataclass(frozen=True, kw_only=True)
class SimEngine:
    """A KV cache config plus engine options; ``simulator()`` builds a fresh manager."""

    kv_cache_config: KVCacheConfig
    config: EngineConfig
    model_name: str = "model"
    hash_algo: str | None = None

    @property
    def num_blocks(self) -> int:
        return self.kv_cache_config.num_blocks

    @property
    def max_model_len(self) -> int:
        planned = self.kv_cache_config.max_model_len
        return planned if planned and planned > 0 else self.config.max_model_len

    def with_num_blocks(self, num_blocks: int) -> SimEngine:
        """The same layout with another block count (for sweeps and --num-blocks)."""
        cfg = dataclasses.replace(self.kv_cache_config, num_blocks=num_blocks)
        return dataclasses.replace(self, kv_cache_config=cfg)

    def simulator(self, settings: SchedulerSettings | None = None) -> Simulator:
        """A simulator over a new, empty ``KVCacheManager``."""
        from pagedkv.runtime import KVCacheManager, Request

        settings = settings or SchedulerSettings()
        config = self.config.replace(
            max_num_batched_tokens=settings.max_num_batched_tokens,
            max_num_seqs=settings.max_num_seqs,
        )
        manager = KVCacheManager(self.kv_cache_config, config, hash_algo=self.hash_algo)
        hasher = manager.hasher if manager.enable_caching else None

        def make_request(request_id: str, token_ids: list[int]) -> Any:
            return Request(request_id, token_ids, hasher=hasher)

        geometry = bound_geometry(self.kv_cache_config)
        return Simulator(
            manager,
            make_request=make_request,
            max_model_len=manager.max_model_len,
            block_size=geometry[0] if geometry else manager.hash_block_size,
            num_blocks=self.num_blocks,
            settings=settings,
            model_name=self.model_name,
            kv_cache_groups=tuple(_group_label(g) for g in self.kv_cache_config.kv_cache_groups),
        )
