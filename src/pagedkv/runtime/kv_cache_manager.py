"""KVCacheManager: the API an engine's scheduler calls every step."""

from __future__ import annotations

import math

from pagedkv.config import EngineConfig
from pagedkv.errors import ConfigError, KVCacheRuntimeError
from pagedkv.planning.types import KVCacheConfig
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


class KVCacheManager:
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
        self._unwritten = self.block_pool._unwritten_by_request  # non-empty: track writes
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
        self._no_hits: tuple[list[int], ...] = tuple([] for _ in self.managers)
        self._empty = KVCacheBlocks(tuple([] for _ in self.managers))
        self._group_meta = [
            (spec.kind, getattr(spec, "sliding_window", None))
            for spec in (group_behaviour_spec(g) for g in groups)
        ]
        self._stats_total = PrefixCacheStatsCounter()
        self._stats_step = PrefixCacheStatsCounter()

    # ------------------------------------------------------------------ state
    @property
    def num_free_blocks(self) -> int:
        return self.block_pool.num_free_blocks

    @property
    def usage(self) -> float:
        """Fraction of usable blocks in use (0 for an empty pool)."""
        return self.block_pool.usage

    @property
    def prefix_cache_stats(self) -> PrefixCacheStats:
        """Lookups and hits since the manager was built."""
        return self._stats_total.snapshot()

    def make_prefix_cache_stats(self) -> PrefixCacheStats:
        """Lookups and hits since the previous call (per engine step), then start afresh."""
        stats = self._stats_step.snapshot()
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

    # ------------------------------------------------------------- allocation
    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_blocks: KVCacheBlocks | None = None,
        num_lookahead_tokens: int = 0,
        delay_cache_blocks: bool = False,
        num_encoder_tokens: int = 0,
        *,
        full_sequence_must_fit: bool = False,
        has_scheduled_reqs: bool = True,
    ) -> KVCacheBlocks | None:
        """Blocks for ``num_new_tokens`` more tokens (plus lookahead slots); None if they
        do not fit, in which case nothing changed except that blocks the request can no
        longer use (fallen out of its window) may have been released.

        A new request adopts ``new_computed_blocks`` (from ``get_computed_blocks``) covering
        ``num_new_computed_tokens`` tokens. Full blocks are cached unless
        ``delay_cache_blocks``; lookahead (draft) slots are never cached. If anything
        raises midway, every change of this call is undone before the exception propagates.
        """
        if num_new_tokens <= 0 and (num_new_tokens < 0 or num_new_computed_tokens == 0):
            raise KVCacheRuntimeError(
                f"request {request.request_id!r}: num_new_tokens must be > 0 when there are "
                f"no computed tokens to adopt, got {num_new_tokens}"
            )
        max_len = self.max_model_len
        total_computed = request.num_computed_tokens + num_new_computed_tokens
        if total_computed > max_len:
            total_computed = max_len
        num_main = total_computed + num_new_tokens
        num_slots = num_main + num_lookahead_tokens
        if num_slots > max_len:
            num_slots = max_len
        request_id = request.request_id
        if request_id in self._first_tables:
            if self._unwritten:
                self.block_pool.mark_written(request_id)  # its previous step has run
            if new_computed_blocks is not None and not new_computed_blocks.is_empty():
                raise KVCacheRuntimeError(
                    f"request {request_id!r} is running; only a new request can adopt cached blocks"
                )
            single = self._single
            if single is None:
                return self._allocate_running(
                    request, num_slots, num_main, delay_cache_blocks, num_encoder_tokens
                )
            # One group (the common case), inlined.
            if single.skips_tokens:
                single.remove_skipped_blocks(request_id, request.num_computed_tokens)
            block_size = single.block_size
            num_new = -(-num_slots // block_size) - len(single.req_to_blocks[request_id])
            cache = self.enable_caching and not delay_cache_blocks
            if num_new <= 0:
                if not cache:
                    return self._empty
                cache_tokens = len(request.block_hashes) * self.hash_block_size
                if num_main < cache_tokens:
                    cache_tokens = num_main
                if cache_tokens // block_size <= single.num_cached_block[request_id]:
                    return self._empty
            elif num_new > self.block_pool.num_free_blocks:
                return None
            return self._transaction(
                request, None, 0, num_slots, num_main, num_encoder_tokens, cache
            )
        if not self.managers:
            return self._empty
        hits = self._no_hits if new_computed_blocks is None else new_computed_blocks.blocks
        if len(hits) != self.num_groups:
            raise KVCacheRuntimeError(
                f"new_computed_blocks has {len(hits)} groups, the model has {self.num_groups}"
            )
        reserve = self.watermark_blocks if has_scheduled_reqs else 0
        if full_sequence_must_fit and not self._full_sequence_fits(
            request, hits, total_computed, reserve
        ):
            return None
        num_needed = 0
        for gid, m in enumerate(self.managers):
            tokens = num_encoder_tokens if self._cross[gid] else num_slots
            num_needed += m.get_num_blocks_to_allocate(
                request.request_id, tokens, hits[gid], total_computed
            )
        if num_needed + reserve > self.block_pool.num_free_blocks:
            return None
        if self.enable_caching and request.hasher is not self.hasher:
            self._attach_hasher(request)
        return self._transaction(
            request,
            hits,
            total_computed,
            num_slots,
            num_main,
            num_encoder_tokens,
            self.enable_caching and not delay_cache_blocks,
        )

    def _allocate_running(
        self,
        request: Request,
        num_slots: int,
        num_main: int,
        delay_cache_blocks: bool,
        num_encoder_tokens: int,
    ) -> KVCacheBlocks | None:
        request_id = request.request_id
        if self._skip_sets:
            self._remove_skipped(request_id, request.num_computed_tokens)
        cache_tokens = -1  # tokens that may be cached now (-1: no caching)
        if self.enable_caching and not delay_cache_blocks:
            cache_tokens = len(request.block_hashes) * self.hash_block_size
            if num_main < cache_tokens:
                cache_tokens = num_main
        first = self._same_block_size
        if first is not None:
            # All groups have one block size: their tables grow and get cached in step.
            block_size = first.block_size
            num_new = -(-num_slots // block_size) - len(first.req_to_blocks[request_id])
            if num_new <= 0:
                if cache_tokens // block_size <= first.num_cached_block[request_id]:
                    return self._empty
            elif num_new * self.num_groups > self.block_pool.num_free_blocks:
                return None
            return self._transaction(
                request, None, 0, num_slots, num_main, num_encoder_tokens, cache_tokens >= 0
            )
        num_needed = 0
        work = False
        cross = self._cross
        for gid, m in enumerate(self.managers):
            block_size = m.block_size
            tokens = num_encoder_tokens if cross[gid] else num_slots
            num_new = -(-tokens // block_size) - len(m.req_to_blocks[request_id])
            if num_new > 0:
                num_needed += num_new
                work = True
            elif cache_tokens // block_size > m.num_cached_block[request_id]:
                work = True
        if not work:
            return self._empty
        if num_needed > self.block_pool.num_free_blocks:
            return None
        return self._transaction(
            request, None, 0, num_slots, num_main, num_encoder_tokens, cache_tokens >= 0
        )

    def _remove_skipped(self, request_id: str, num_computed_tokens: int) -> None:
        """Free blocks that left a window; identical groups share one skip computation."""
        for probe, group in self._skip_sets:
            skipped = probe.get_num_skipped_tokens(num_computed_tokens)
            if skipped <= 0:
                continue
            last = skipped // probe.block_size
            for m in group:
                table = m.req_to_blocks[request_id]
                index = (last if last < len(table) else len(table)) - 1
                if index >= 0 and table[index]:
                    m.remove_skipped_blocks(request_id, num_computed_tokens)

    def _transaction(
        self,
        request: Request,
        hits: tuple[list[int], ...] | None,
        total_computed: int,
        num_slots: int,
        num_main: int,
        num_encoder_tokens: int,
        cache: bool,
    ) -> KVCacheBlocks:
        """Adopt hits (new requests), allocate, cache; all or nothing."""
        request_id = request.request_id
        managers = self.managers
        pool = self.block_pool
        saved = [m.save(request_id) for m in managers]
        savepoint = pool.begin()
        try:
            if hits is not None:
                # Every group adopts its hits before any group allocates, so an
                # allocation can never evict another group's hit blocks.
                for gid, m in enumerate(managers):
                    m.add_local_computed_blocks(request_id, hits[gid], total_computed)
                if self.enable_caching:
                    # Where later requests are likely to hit: this prompt's end, a prefix
                    # another group had (the junction), and the hit just adopted (shared).
                    boundaries = (
                        request.num_prompt_tokens - 1,
                        request.shared_prefix_boundary,
                        total_computed,
                    )
                    for m in self._skipping:
                        m.set_retained_boundaries(request_id, boundaries)
            cross = self._cross
            new_blocks = tuple(
                m.allocate_new_blocks(request_id, num_encoder_tokens if cross[gid] else num_slots)
                for gid, m in enumerate(managers)
            )
            if cache:
                num_cacheable = min(num_main, len(request.all_token_ids))
                for m in managers:
                    m.cache_blocks(request, num_cacheable)
        except BaseException:
            pool.rollback(savepoint)
            for m, state in zip(managers, saved):
                m.rollback(request_id, state)
            raise
        pool.commit()
        return KVCacheBlocks(new_blocks)

    def _full_sequence_fits(
        self, request: Request, hits: tuple[list[int], ...], total_computed: int, reserve: int
    ) -> bool:
        num_tokens = min(request.num_tokens, self.max_model_len)
        needed = 0
        for gid, m in enumerate(self.managers):
            if self._cross[gid]:
                continue
            cap = m.max_admission_blocks()
            capped_tokens = num_tokens if cap is None else min(num_tokens, cap * m.block_size)
            needed += m.get_num_blocks_to_allocate(
                request.request_id, capped_tokens, hits[gid], total_computed
            )
        return needed + reserve <= self.block_pool.num_free_blocks

    # ---------------------------------------------------------------- freeing
    def free(self, request: Request | str) -> None:
        """Release every block of the request, last blocks first (evicted first)."""
        request_id = request if isinstance(request, str) else request.request_id
        if self._unwritten:
            self.block_pool.mark_written(request_id)
        for m in self.managers:
            m.free(request_id)

    def remove_skipped_blocks(self, request_id: str, num_computed_tokens: int) -> None:
        """Free blocks that fell out of the request's window (nulls in its table)."""
        for m in self._skipping:
            m.remove_skipped_blocks(request_id, num_computed_tokens)

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
        self.block_pool.clear_unwritten()

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
