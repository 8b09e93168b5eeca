"""KVCacheManager: the API an engine's scheduler calls every step."""

from __future__ import annotations

import math

from pagedkv.config import EngineConfig
from pagedkv.errors import ConfigError, KVCacheRuntimeError
from pagedkv.planning.types import KVCacheConfig
from pagedkv.runtime.allocation import SlotAllocator
from pagedkv.runtime.blocks import KVCacheBlocks
from pagedkv.runtime.coordinators import group_behaviour_spec, make_coordinator
from pagedkv.runtime.events import BlockStored, KVCacheEvent
from pagedkv.runtime.hashing import DEFAULT_CHAIN_SEED, BlockHasher
from pagedkv.runtime.managers.base import SingleTypeKVCacheManager
from pagedkv.runtime.managers.cross import CrossAttentionManager
from pagedkv.runtime.request import Request
from pagedkv.runtime.stats import PrefixCacheStats, PrefixCacheStatsCounter


def _resolve_caching(
    kv_cache_config: KVCacheConfig, config: EngineConfig, enable_caching: bool | None
) -> bool:
    specs = [group_behaviour_spec(g) for g in kv_cache_config.kv_cache_groups]
    if not specs:
        return False  # nothing to cache
    if enable_caching is None:
        return config.cache.enable_prefix_caching and all(s.prefix_cacheable for s in specs)
    if enable_caching:
        for gid, spec in enumerate(specs):
            if not spec.prefix_cacheable:
                raise ConfigError(
                    f"enable_caching=True but KV cache group {gid} ({type(spec).__name__}, "
                    f"kind {spec.kind!r}) cannot be prefix-cached"
                )
    return enable_caching


class KVCacheManager(SlotAllocator):
    """Allocates, caches and frees KV cache blocks for requests, for every group at once.

    ``get_computed_blocks`` finds a new request's cache hit, ``allocate_slots`` gives it
    (or a running request) the blocks for its next tokens, ``free`` releases them.
    """

    def __init__(
        self,
        kv_cache_config: KVCacheConfig,
        config: EngineConfig,
        *,
        enable_caching: bool | None = None,
        hash_algo: str | None = None,
        enable_events: bool = False,
        watermark: float = 0.0,
        hash_seed: str = DEFAULT_CHAIN_SEED,
    ) -> None:
        if not 0.0 <= watermark < 1.0:
            raise ConfigError(f"KVCacheManager watermark must be in [0, 1), got {watermark!r}")
        groups = kv_cache_config.kv_cache_groups
        planned_len = kv_cache_config.max_model_len
        self.max_model_len = (
            planned_len if planned_len and planned_len > 0 else config.max_model_len
        )
        if self.max_model_len <= 0:
            raise ConfigError("KVCacheManager needs a positive max_model_len")
        self.enable_caching = _resolve_caching(kv_cache_config, config, enable_caching)
        block_sizes = [g.kv_cache_spec.block_size for g in groups]
        self.scheduler_block_size = math.lcm(*block_sizes) if block_sizes else 1
        self.hash_block_size = math.gcd(*block_sizes) if block_sizes else 1
        self.hasher = BlockHasher(
            self.hash_block_size, hash_algo or config.cache.hash_algo, hash_seed
        )
        self.coordinator = make_coordinator(
            kv_cache_config,
            max_model_len=self.max_model_len,
            enable_caching=self.enable_caching,
            hash_block_size=self.hash_block_size,
            alignment_tokens=self.scheduler_block_size,
            enable_events=enable_events,
            in_flight_tokens=config.max_in_flight_tokens,
        )
        self.block_pool = self.coordinator.block_pool
        self.managers = self.coordinator.managers
        self.num_groups = len(self.managers)
        self.watermark_blocks = int(watermark * kv_cache_config.num_blocks)
        self._skipping = [m for m in self.managers if m.skips_tokens]
        sets: dict[tuple[type, object], list[SingleTypeKVCacheManager]] = {}
        for m in self._skipping:
            sets.setdefault((type(m), m.kv_cache_spec), []).append(m)
        self._skip_sets = [(group[0], group) for group in sets.values()]
        self._cross = [isinstance(m, CrossAttentionManager) for m in self.managers]
        # Tables of group 0: membership says whether a request is running.
        self._first_tables: dict[str, list[int]] = (
            self.managers[0].req_to_blocks if self.managers else {}
        )
        self._single = self.managers[0] if self.num_groups == 1 and not self._cross[0] else None
        distinct_sizes = {m.block_size for m in self.managers}
        self._same_block_size = (
            self.managers[0] if len(distinct_sizes) == 1 and not any(self._cross) else None
        )
        # One pool allocation can serve every group unless a manager allocates its own way.
        base_allocate = SingleTypeKVCacheManager.allocate_new_blocks
        self._lockstep = all(type(m).allocate_new_blocks is base_allocate for m in self.managers)
        self._no_hits: tuple[list[int], ...] = tuple([] for _ in self.managers)
        self._empty = KVCacheBlocks(tuple([] for _ in self.managers))
        self._group_meta = [
            (spec.kind, getattr(spec, "sliding_window", None))
            for spec in (group_behaviour_spec(g) for g in groups)
        ]
        self._stats_total = PrefixCacheStatsCounter()
        self._stats_step = PrefixCacheStatsCounter()
        self._evictions_at_step = 0

    # ------------------------------------------------------------------ state
    @property
    def num_free_blocks(self) -> int:
        return self.block_pool.num_free_blocks

    @property
    def usage(self) -> float:
        """Fraction of usable blocks in use (0 for an empty pool)."""
        return self.block_pool.usage

    @property
    def num_evictions(self) -> int:
        """Cached blocks evicted since the manager was built: reused for new content (the
        LRU victims) or dropped by ``evict_blocks``; a failed allocation's are not counted."""
        return self.block_pool.num_evictions

    @property
    def prefix_cache_stats(self) -> PrefixCacheStats:
        """Lookups, hits and evictions since the manager was built."""
        return self._stats_total.snapshot(self.block_pool.num_evictions)

    def make_prefix_cache_stats(self) -> PrefixCacheStats:
        """Lookups, hits and evictions since the previous call (per engine step), then
        start afresh."""
        total = self.block_pool.num_evictions
        stats = self._stats_step.snapshot(total - self._evictions_at_step)
        self._evictions_at_step = total
        self._stats_step = PrefixCacheStatsCounter()
        return stats

    def get_block_ids(self, request_id: str) -> tuple[list[int], ...]:
        """A copy of the request's block table, one list per group (null blocks are 0)."""
        return tuple(list(m.req_to_blocks.get(request_id, ())) for m in self.managers)

    def get_blocks(self, request_id: str) -> KVCacheBlocks:
        return KVCacheBlocks(self.get_block_ids(request_id))

    # ----------------------------------------------------------------- lookup
    def get_computed_blocks(self, request: Request) -> tuple[KVCacheBlocks, int]:
        """The request's longest cached prefix: blocks per group and its length in tokens.

        At most ``num_tokens - 1`` tokens hit (the last token is always recomputed).
        Nothing is referenced until ``allocate_slots`` adopts the blocks.
        """
        if not self.enable_caching:
            return self._empty, 0
        if request.hasher is not self.hasher:
            self._attach_hasher(request)
        lists, num_hit, longest = self.coordinator.find_longest_cache_hit(
            request.block_hashes, request.num_tokens - 1
        )
        # A longer prefix that some group had: other requests share it, so this request
        # keeps the blocks a hit there needs (see set_retained_boundaries).
        request.shared_prefix_boundary = longest if longest > num_hit else 0
        preempted = request.num_preemptions > 0
        self._stats_total.record(request.num_tokens, num_hit, preempted)
        self._stats_step.record(request.num_tokens, num_hit, preempted)
        request.num_cached_tokens = num_hit
        if not num_hit:
            return self._empty, 0
        return KVCacheBlocks(tuple(lists)), num_hit

    def _attach_hasher(self, request: Request) -> None:
        hasher = request.hasher
        if hasher is not None and (
            hasher.block_size != self.hash_block_size or hasher.hash_algo != self.hasher.hash_algo
        ):
            raise KVCacheRuntimeError(
                f"request {request.request_id!r} was hashed with block size {hasher.block_size} "
                f"and {hasher.hash_algo!r}; this manager needs {self.hash_block_size} and "
                f"{self.hasher.hash_algo!r}"
            )
        request.set_hasher(self.hasher)

    # ---------------------------------------------------------------- freeing
    def free(self, request: Request | str) -> None:
        """Release every block of the request, last blocks first (evicted first)."""
        if isinstance(request, str):
            request_id, priority = request, 0
        else:
            request_id, priority = request.request_id, request.priority
        for m in self.managers:
            m.free(request_id, priority)

    def remove_skipped_blocks(self, request_id: str, num_computed_tokens: int) -> None:
        """Free blocks that fell out of the request's window (nulls in its table)."""
        if request_id in self._first_tables:
            self._remove_skipped(request_id, num_computed_tokens)

    def evict_blocks(self, block_ids: list[int]) -> None:
        """Drop the cached hashes of the given blocks (they stay allocated if in use)."""
        self.block_pool.evict_blocks(block_ids)

    def reset_prefix_cache(self) -> bool:
        """Forget every cached block; False (nothing done) while any block is in use."""
        if not self.block_pool.reset_prefix_cache():
            return False
        self._stats_total.reset = True
        self._stats_step.reset = True
        return True

    def new_step_starts(self) -> None:
        """Call once per engine step: checkpoints cached in earlier steps become usable."""
        for m in self.managers:
            m.new_step_starts()

    def take_events(self) -> list[KVCacheEvent]:
        """KV cache events since the last call, BlockStored annotated with the group kind."""
        events = self.block_pool.take_events()
        meta = self._group_meta
        for event in events:
            if isinstance(event, BlockStored) and event.group_idx is not None:
                kind, window = meta[event.group_idx]
                event.kv_cache_spec_kind = kind
                event.kv_cache_spec_sliding_window = window
        return events

    def cache_blocks(self, request: Request, num_computed_tokens: int) -> None:
        """Cache the request's full blocks up to ``num_computed_tokens`` (after a delayed
        allocation)."""
        if self.enable_caching:
            for m in self.managers:
                m.cache_blocks(request, num_computed_tokens)

    def __repr__(self) -> str:
        kinds = ", ".join(kind for kind, _ in self._group_meta)
        return (
            f"KVCacheManager(groups=[{kinds}], num_blocks={self.block_pool.num_blocks}, "
            f"caching={self.enable_caching})"
        )
