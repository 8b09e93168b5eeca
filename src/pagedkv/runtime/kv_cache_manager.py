"""KVCacheManager: the API an engine's scheduler calls every step."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from enum import Enum
from typing import NamedTuple

from pagedkv.config import PREFIX_CACHE_RETENTIONS, EngineConfig
from pagedkv.errors import ConfigError, KVCacheRuntimeError
from pagedkv.planning.types import KVCacheConfig
from pagedkv.runtime.block_sizes import resolve_block_sizes
from pagedkv.runtime.blocks import KVCacheBlocks
from pagedkv.runtime.coordinators import (
    SpeculativeGrowth,
    TableGrowth,
    UnitaryCoordinator,
    make_coordinator,
    resolve_caching,
)
from pagedkv.runtime.events import (
    BlockStored,
    KVCacheEvent,
    event_sliding_window,
    event_spec_kind,
)
from pagedkv.runtime.free_queue import FreeQueue
from pagedkv.runtime.hashing import BlockHasher
from pagedkv.runtime.managers.base import Retention, SingleTypeKVCacheManager
from pagedkv.runtime.managers.full import FullAttentionManager
from pagedkv.runtime.request import Request
from pagedkv.runtime.stats import PrefixCacheStats, stats_from_counts

__all__ = [
    "BlockCopy",
    "BlockCopies",
    "FROM_CONFIG",
    "KVCacheManager",
    "PrefixCacheStatsCounter",
    "retention_class",
    "check_retention_interval",
]


class BlockCopy(NamedTuple):
    """Copy block ``src_block_id``'s contents into ``dst_block_id`` (vLLM's KVCacheBlockCopy)."""

    src_block_id: int
    dst_block_id: int


class BlockCopies(NamedTuple):
    copies: list[BlockCopy]
    retained_blocks: list[int]


# A one-group model's plain steps: its tables, cached counts, block size and step_plainly.
PlainSteps = tuple[
    dict[str, list[int]],
    dict[str, int],
    int,
    Callable[[Request, int, int, bool], tuple[list[int], ...]],
]


class _FromConfig(Enum):
    VALUE = "config"


FROM_CONFIG = _FromConfig.VALUE  # an option not given: the EngineConfig's value


class PrefixCacheStatsCounter:
    """Lookups and hits since construction and since the previous ``take_step``."""

    def __init__(self) -> None:
        self._total = [0] * 6  # requests, queries, hits; then the same after preemption
        self._step = [0] * 6
        self._reset = [False, False]  # total, step
        self._evictions_at_step = 0

    def record(self, num_tokens: int, num_hit_tokens: int, preempted: bool) -> None:
        i = 3 if preempted else 0
        for counts in (self._total, self._step):
            counts[i] += 1
            counts[i + 1] += num_tokens
            counts[i + 2] += num_hit_tokens

    def mark_reset(self) -> None:
        self._reset = [True, True]

    def total(self, evictions: int) -> PrefixCacheStats:
        return stats_from_counts(self._total, self._reset[0], evictions)

    def take_step(self, evictions: int) -> PrefixCacheStats:
        """The step's counts (``evictions``: the running total), then start afresh."""
        step = evictions - self._evictions_at_step
        stats = stats_from_counts(self._step, self._reset[1], step)
        self._step, self._reset[1], self._evictions_at_step = [0] * 6, False, evictions
        return stats


class KVCacheManager:
    """Allocates, caches and frees KV cache blocks for requests, for every group at once.

    The speculative-decoding options are the ones vLLM's scheduler passes.

    Args:
        kv_cache_config: the planned groups, pool size and ``max_model_len``.
        config: the engine configuration the other options default from.
        enable_caching: prefix caching on or off (None: ``CacheConfig``'s, where the
            groups allow it).
        hash_algo: a name in ``hashing.HASH_FUNCTIONS`` (None: ``CacheConfig.hash_algo``).
        enable_events: record KV cache events (``take_events`` drains them).
        watermark: fraction of the pool, in [0, 1), a new request must leave free
            while others are scheduled.
        hash_seed: the seed of the first block's parent hash (None: vLLM's rule).
        retention: a name in ``config.PREFIX_CACHE_RETENTIONS`` (None:
            ``CacheConfig.prefix_cache_retention``).
        free_queue: the pool's free-block order (None: vLLM's LRU queue).
        hash_block_size: tokens per block hash (vLLM's name); overrides
            ``CacheConfig.prefix_match_unit``.
        prefix_cache_retention_interval: tokens between the states a sparse kind caches
            (vLLM's name); overrides ``CacheConfig.prefix_cache_retention_interval``
            unless left at ``FROM_CONFIG``.
        use_eagle: EAGLE: drop the last matched block of the EAGLE groups' hits.
        num_hash_lookahead_tokens: tokens after each block that its hash covers too.
        num_prefill_lookahead: tokens past the computed ones the drafter reads (all but
            one are not final).
        dcp_world_size: decode context parallel ranks; above 1 (the config's attention
            blocks already span every rank) a Mamba "align" block as small as the hash
            block still takes partial hash hits, as vLLM does.

    Raises:
        ConfigError: an option is out of range, or the config needs an extension the
            manager was not given (a non-LRU eviction policy without ``free_queue``).
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
        hash_seed: str | None = None,
        retention: str | None = None,
        free_queue: FreeQueue | None = None,
        hash_block_size: int | None = None,
        prefix_cache_retention_interval: int | _FromConfig | None = FROM_CONFIG,
        use_eagle: bool = False,
        num_hash_lookahead_tokens: int = 0,
        num_prefill_lookahead: int = 0,
        dcp_world_size: int = 1,
    ) -> None:
        if hash_block_size is not None:
            config = config.replace(prefix_match_unit=hash_block_size)
        if prefix_cache_retention_interval is not FROM_CONFIG:
            config = config.replace(prefix_cache_retention_interval=prefix_cache_retention_interval)
        if not 0.0 <= watermark < 1.0:
            raise ConfigError(f"KVCacheManager watermark must be in [0, 1), got {watermark!r}")
        for name, value in (
            ("num_hash_lookahead_tokens", num_hash_lookahead_tokens),
            ("num_prefill_lookahead", num_prefill_lookahead),
        ):
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ConfigError(
                    f"KVCacheManager {name} must be a non-negative integer, got {value!r}"
                )
        if not isinstance(dcp_world_size, int) or dcp_world_size < 1:
            raise ConfigError(f"KVCacheManager dcp_world_size must be >= 1, got {dcp_world_size!r}")
        self.retention = retention = retention or config.cache.prefix_cache_retention
        groups = kv_cache_config.kv_cache_groups
        planned_len = kv_cache_config.max_model_len
        self.max_model_len = (
            planned_len if planned_len and planned_len > 0 else config.max_model_len
        )
        if self.max_model_len <= 0:
            raise ConfigError("KVCacheManager needs a positive max_model_len")
        self.enable_caching = resolve_caching(
            groups, config.cache.enable_prefix_caching, enable_caching
        )
        sizes = resolve_block_sizes(
            groups, self.enable_caching, config.cache.prefix_match_unit, dcp_world_size
        )
        self.scheduler_block_size = sizes.scheduler_block_size
        self.hash_block_size = sizes.hash_block_size
        self.cache_hit_alignment_tokens = sizes.cache_hit_alignment_tokens
        self.enable_partial_hash_hits = sizes.partial_hash_hits
        self.num_hash_lookahead_tokens = num_hash_lookahead_tokens
        self.hasher = BlockHasher(
            self.hash_block_size,
            hash_algo or config.cache.hash_algo,
            hash_seed,
            num_hash_lookahead_tokens,
        )
        policy = config.cache.eviction_policy
        if free_queue is None and policy != "lru":
            raise ConfigError(
                f"CacheConfig.eviction_policy={policy!r} is an extension: build the manager with "
                "pagedkv.policies.make_kv_cache_manager (or pass free_queue=)"
            )
        self.coordinator = coordinator = make_coordinator(
            kv_cache_config,
            max_model_len=self.max_model_len,
            enable_caching=self.enable_caching,
            hash_block_size=self.hash_block_size,
            alignment_tokens=self.cache_hit_alignment_tokens,
            enable_events=enable_events,
            in_flight_tokens=config.max_in_flight_tokens,
            retention=retention_class(retention),
            retention_interval=config.cache.prefix_cache_retention_interval,
            free_queue=free_queue,
            use_eagle=use_eagle,
            num_prefill_lookahead=num_prefill_lookahead,
            num_hash_lookahead_tokens=num_hash_lookahead_tokens,
            scheduler_block_size=self.scheduler_block_size,
            partial_hash_hits=self.enable_partial_hash_hits,
        )
        self.use_eagle = use_eagle
        self.enable_events = enable_events
        self.block_pool = coordinator.block_pool
        self.managers = managers = coordinator.managers
        check_retention_interval(
            config.cache.prefix_cache_retention_interval, self.scheduler_block_size, managers
        )
        self.num_groups = len(managers)
        self.watermark_blocks = int(watermark * kv_cache_config.num_blocks)
        # The decode step's look-ups, bound once (most steps use nothing else).
        self._block_tables = coordinator.block_tables  # a request runs while it has one
        self._skip_steps = coordinator.skip_steps
        # The idle-step check's parts, bound as plain attributes (read fastest).
        check = coordinator.idle_step_check
        self._idle_groups: list[TableGrowth] | None = None
        self._idle_speculative: list[SpeculativeGrowth] = []
        self._idle_cache_step = 1
        self._idle_tail_keyers: list[FullAttentionManager] = []
        self._idle_counts_new_blocks = False
        if check is not None:
            self._idle_groups = check.groups
            self._idle_speculative = check.speculative
            self._idle_cache_step = check.cache_step
            self._idle_tail_keyers = check.tail_keyers
            self._idle_counts_new_blocks = check.counts_new_blocks
        # One group that takes plain steps: its idle check, then ``step_plainly``.
        self._plain: PlainSteps | None = None
        if (
            isinstance(coordinator, UnitaryCoordinator)
            and coordinator.plain_step is not None
            and check is not None
            and not check.speculative
            and not check.tail_keyers
        ):
            tables, cached_by_request, block_size = coordinator.plain_step[:3]
            self._plain = (tables, cached_by_request, block_size, coordinator.step_plainly)
        self._no_hits: tuple[list[int], ...] = tuple([] for _ in managers)
        self._empty = KVCacheBlocks(self._no_hits)
        self._group_meta = [
            (event_spec_kind(g.kv_cache_spec), event_sliding_window(g.kv_cache_spec))
            for g in groups
        ]
        self._stats = PrefixCacheStatsCounter()

    @property
    def num_free_blocks(self) -> int:
        return self.block_pool.num_free_blocks

    @property
    def usage(self) -> float:
        """Fraction of usable blocks in use (0 for an empty pool)."""
        return self.block_pool.usage

    @property
    def num_evictions(self) -> int:
        """Cached blocks evicted (reused or by ``evict_blocks``); failed allocations' not."""
        return self.block_pool.num_evictions

    @property
    def prefix_cache_stats(self) -> PrefixCacheStats:
        """Lookups, hits and evictions since the manager was built."""
        return self._stats.total(self.block_pool.num_evictions)

    def make_prefix_cache_stats(self) -> PrefixCacheStats:
        """Lookups, hits and evictions since the previous call (per engine step)."""
        return self._stats.take_step(self.block_pool.num_evictions)

    def get_block_ids(self, request_id: str) -> tuple[list[int], ...]:
        """A copy of the request's block table, one list per group (null blocks are 0)."""
        return self.coordinator.get_block_ids(request_id)

    def get_blocks(self, request_id: str) -> KVCacheBlocks:
        return KVCacheBlocks(self.get_block_ids(request_id))

    def get_computed_blocks(self, request: Request) -> tuple[KVCacheBlocks, int]:
        """Longest cached prefix (blocks per group, tokens) of at most ``num_tokens - 1``
        (none for a request that skips reading the prefix cache)."""
        if not self.enable_caching or request.skip_reading_prefix_cache:
            return self._empty, 0
        if request.hasher is not self.hasher:
            self._attach_hasher(request)
        num_tokens = len(request.all_token_ids)
        lists, num_hit, longest = self.coordinator.find_longest_cache_hit(
            request.block_hashes, num_tokens - 1
        )
        if num_hit and self.enable_events and request.kv_cache_report_mode == "full":
            self.coordinator.emit_cached_block_events(request, lists)
        # A longer prefix some group had: the request keeps the blocks a hit there needs.
        request.shared_prefix_boundary = longest if longest > num_hit else 0
        self._stats.record(num_tokens, num_hit, request.num_preemptions > 0)
        request.num_cached_tokens = num_hit
        if not num_hit:
            return self._empty, 0
        return KVCacheBlocks(tuple(lists)), num_hit

    def _attach_hasher(self, request: Request) -> None:
        hasher = request.hasher
        mine = self.hasher
        if hasher is not None and (
            hasher.block_size != mine.block_size
            or hasher.hash_algo != mine.hash_algo
            or hasher.num_lookahead_tokens != mine.num_lookahead_tokens
        ):
            raise KVCacheRuntimeError(
                f"request {request.request_id!r} was hashed with block size {hasher.block_size}, "
                f"{hasher.hash_algo!r} and {hasher.num_lookahead_tokens} lookahead tokens; this "
                f"manager needs {mine.block_size}, {mine.hash_algo!r} and "
                f"{mine.num_lookahead_tokens}"
            )
        request.set_hasher(mine)

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
        reserved_blocks: int = 0,
        num_external_computed_tokens: int = 0,
    ) -> KVCacheBlocks | None:
        """Blocks for ``num_new_tokens`` more tokens (plus lookahead), or None if they do
        not fit beside ``reserved_blocks`` kept free for other sequences (not counted
        against the full sequence). A new request adopts ``new_computed_blocks``, then
        gets blocks for ``num_external_computed_tokens`` a KV connector loads after them;
        full blocks are cached unless ``delay_cache_blocks``. If anything raises midway,
        the allocation is undone.

        Args:
            request: the request to allocate for.
            num_new_tokens: tokens the step computes, after the computed ones.
            num_new_computed_tokens: cached tokens ``new_computed_blocks`` holds (the
                prefix-cache hit ``get_computed_blocks`` returned).
            new_computed_blocks: the hit's blocks per group (a new request only).
            num_lookahead_tokens: speculative tokens past the step that need slots too
                (capped at ``max_model_len``).
            delay_cache_blocks: do not cache the blocks that become full (a KV
                connector fills them later).
            num_encoder_tokens: encoder tokens the cross-attention groups need slots for.
            full_sequence_must_fit: admit only if the request's whole current sequence
                (capped at ``max_model_len``) fits in the free blocks.
            has_scheduled_reqs: other requests are scheduled this step, so a new request
                must leave the watermark free.
            reserved_blocks: free blocks to keep for other sequences.
            num_external_computed_tokens: tokens a KV connector loads after the hit.

        Returns:
            The newly allocated blocks per group, or None when they do not fit.

        Raises:
            KVCacheRuntimeError: a token count is negative or exceeds ``max_model_len``,
                or a running request is given cached blocks.
        """
        request_id = request.request_id
        if num_new_tokens <= 0 or num_lookahead_tokens < 0:
            if num_lookahead_tokens < 0:
                raise KVCacheRuntimeError(
                    f"request {request_id!r}: num_lookahead_tokens must be >= 0, "
                    f"got {num_lookahead_tokens}"
                )
            if num_new_tokens < 0 or not (num_new_computed_tokens or num_external_computed_tokens):
                raise KVCacheRuntimeError(
                    f"request {request_id!r}: num_new_tokens must be > 0 when there are "
                    f"no computed tokens to adopt, got {num_new_tokens}"
                )
        running = request_id in self._block_tables
        hits = self._no_hits
        if new_computed_blocks is not None:
            hits = new_computed_blocks.blocks
            if len(hits) != self.num_groups:
                raise KVCacheRuntimeError(
                    f"new_computed_blocks has {len(hits)} groups, the model has {self.num_groups}"
                )
            if running and any(hits):
                raise KVCacheRuntimeError(
                    f"request {request_id!r} is running; only a new request can adopt cached blocks"
                )
        total_computed = request.num_computed_tokens + num_new_computed_tokens
        if num_new_computed_tokens and not (
            0 < total_computed <= len(request.all_token_ids) and num_new_computed_tokens > 0
        ):
            raise KVCacheRuntimeError(
                f"request {request_id!r} adopts {num_new_computed_tokens} computed tokens "
                f"after {request.num_computed_tokens}, but it has "
                f"{len(request.all_token_ids)} tokens"
            )
        if num_external_computed_tokens:
            if num_external_computed_tokens < 0:
                raise KVCacheRuntimeError(
                    f"request {request_id!r}: num_external_computed_tokens must be >= 0, "
                    f"got {num_external_computed_tokens}"
                )
            total_computed += num_external_computed_tokens
        max_len = self.max_model_len
        num_main = total_computed + num_new_tokens
        if num_main > max_len:
            raise KVCacheRuntimeError(
                f"request {request_id!r} needs slots for {num_main} tokens, more than "
                f"max_model_len={max_len}"
            )
        num_slots = num_main + num_lookahead_tokens
        if num_slots > max_len:
            num_slots = max_len
        if full_sequence_must_fit:
            coordinator = self.coordinator
            whole = min(len(request.all_token_ids), max_len)
            whole_needed = coordinator.get_num_blocks_to_allocate(
                request_id,
                whole,
                hits,
                num_encoder_tokens,
                total_computed,
                whole,
                apply_admission_cap=True,
                prefill_end=coordinator.prefill_end_of(request),
            )
            if whole_needed + self._reserve(running, has_scheduled_reqs) > self.num_free_blocks:
                return None
        cache = self.enable_caching and not delay_cache_blocks
        if running:
            if self._skip_steps:  # the coordinator's remove_skipped_blocks, inline
                num_prompt = request.num_prompt_tokens
                for remove, peers, floors, next_skip in self._skip_steps:
                    if floors is None:
                        remove(request_id, total_computed, peers, num_prompt)
                    elif total_computed >= floors.get(request_id, 0):
                        remove(request_id, total_computed, peers, num_prompt)
                        floors[request_id] = next_skip(total_computed) or 0
            plain = self._plain
            if plain is not None:
                # The IdleStepCheck of one group that takes plain steps, shortest.
                tables, cached_by_request, block_size, step_plainly = plain
                num_new = -(-num_slots // block_size) - len(tables[request_id])
                cache_tokens = len(request.all_token_ids) if cache else 0
                if cache_tokens > num_main:
                    cache_tokens = num_main
                grows = num_new > 0
                caches = cache_tokens // block_size > cached_by_request[request_id]
                if not (grows or caches):
                    if reserved_blocks and reserved_blocks > self.num_free_blocks:
                        return None  # vLLM's: nothing to allocate still needs the reserve
                    return self._empty
                if (num_new if grows else 0) + reserved_blocks > len(self.block_pool.queue):
                    return None
                if self.enable_caching and request.hasher is not self.hasher:
                    self._attach_hasher(request)
                num_computed = min(num_main, len(request.all_token_ids))
                new_blocks = step_plainly(request, num_slots, num_computed, cache and caches)
                return KVCacheBlocks(new_blocks) if new_blocks[0] else self._empty
        needed: int | None = None  # free blocks the step takes, once counted
        grows = caches = True  # the step may grow a table, may cache a block
        if running:
            idle_groups = self._idle_groups
            if idle_groups is not None:
                # The coordinator's IdleStepCheck, inline: most decode steps end here.
                cache_tokens = len(request.all_token_ids) if cache else 0
                if cache_tokens > num_main:
                    cache_tokens = num_main
                if self._idle_cache_step > 1:
                    cache_tokens -= cache_tokens % self._idle_cache_step
                num_new_blocks = 0
                caches = False
                # cdiv written inline below: this check runs every decode step.
                for block_size, tables, num_cached, encoder in idle_groups:
                    tokens = num_encoder_tokens if encoder else num_slots
                    num_new = -(-tokens // block_size) - len(tables[request_id])
                    if num_new > 0:
                        num_new_blocks += num_new
                    if cache_tokens // block_size > num_cached[request_id]:
                        caches = True
                grows = num_new_blocks > 0
                for block_size, tables, spec_blocks, align in self._idle_speculative:
                    tokens = num_main if align else num_slots
                    if -(-tokens // block_size) + spec_blocks > len(tables[request_id]):
                        grows = True
                if not caches and self._idle_tail_keyers:
                    caches = any(
                        m.tail_key_pending(request, cache_tokens) for m in self._idle_tail_keyers
                    )
                if not (grows or caches):
                    if reserved_blocks and reserved_blocks > self.num_free_blocks:
                        return None  # vLLM's: nothing to allocate still needs the reserve
                    return self._empty
                if self._idle_counts_new_blocks:
                    needed = num_new_blocks
                else:
                    grows = True  # the count is a lower bound: every group is asked
        if needed is None:
            coordinator = self.coordinator
            needed = self._reserve(running, has_scheduled_reqs) + (
                coordinator.get_num_blocks_to_allocate(
                    request_id,
                    num_slots,
                    hits,
                    num_encoder_tokens,
                    total_computed,
                    num_main,
                    prefill_end=coordinator.prefill_end_of(request),
                )
            )
        if needed + reserved_blocks > self.block_pool.num_free_blocks:
            return None
        if self.enable_caching and request.hasher is not self.hasher:
            self._attach_hasher(request)
        external = 0 if running else num_external_computed_tokens
        return self._allocate(
            request,
            running,
            hits,
            total_computed,
            num_slots,
            num_main,
            num_encoder_tokens,
            cache and caches,
            external,
            grows,
        )

    def _allocate(
        self,
        request: Request,
        running: bool,
        hits: tuple[list[int], ...],
        total_computed: int,
        num_slots: int,
        num_main: int,
        num_encoder_tokens: int,
        cache: bool,
        external: int,
        grows: bool,
    ) -> KVCacheBlocks:
        # One transaction of the block pool: anything raising midway is undone. A running
        # request's step that the idle check found grows no table (``grows`` False) skips
        # the growth; one that caches nothing comes with ``cache`` False.
        request_id = request.request_id
        coordinator = self.coordinator
        pool = self.block_pool
        num_computed = min(num_main, len(request.all_token_ids))
        savepoint = pool.begin()
        try:
            coordinator.journal_tables(request_id)
            if not running:
                coordinator.allocate_new_computed_blocks(request_id, hits, total_computed, external)
            new_blocks = self._no_hits
            if grows:
                new_blocks = coordinator.allocate_new_blocks(
                    request_id, num_slots, num_main, num_encoder_tokens
                )
            if cache:
                coordinator.cache_blocks(request, num_computed)
        except BaseException:
            pool.rollback(savepoint)
            raise
        pool.commit()
        return KVCacheBlocks(new_blocks) if any(new_blocks) else self._empty

    def _reserve(self, running: bool, has_scheduled_reqs: bool) -> int:
        return self.watermark_blocks if has_scheduled_reqs and not running else 0

    def free(self, request: Request | str) -> None:
        """Release every block of the request, last blocks first (evicted first)."""
        if isinstance(request, str):
            self.coordinator.free(request)
        else:
            self.coordinator.free(request.request_id, request.priority)

    def remove_skipped_blocks(
        self, request_id: str, num_computed_tokens: int, num_prompt_tokens: int | None = None
    ) -> None:
        """Free blocks that fell out of the request's window (nulls in its table); R-SWA
        groups free their decode gap only when given the prompt length."""
        if request_id in self._block_tables:
            self.coordinator.remove_skipped_blocks(
                request_id, num_computed_tokens, num_prompt_tokens
            )

    def evict_blocks(self, block_ids: list[int]) -> None:
        """Drop the cached hashes of the given blocks (they stay allocated if in use)."""
        self.block_pool.evict_blocks(block_ids)

    def reset_prefix_cache(self) -> bool:
        """Forget every cached block; False (nothing done) while any block is in use."""
        if not self.block_pool.reset_prefix_cache():
            return False
        self._stats.mark_reset()
        return True

    def new_step_starts(self) -> None:
        """Call once per engine step: checkpoints cached in earlier steps become usable."""
        self.coordinator.new_step_starts()

    def take_events(self) -> list[KVCacheEvent]:
        """KV cache events since the last call, BlockStored annotated with its group's spec
        kind and window (an event naming no group of this model passes through as is)."""
        events = self.block_pool.take_events()
        meta = self._group_meta
        for event in events:
            if isinstance(event, BlockStored):
                gid = event.group_idx
                if gid is not None and 0 <= gid < len(meta):
                    event.kv_cache_spec_kind, event.kv_cache_spec_sliding_window = meta[gid]
        return events

    def take_kv_cache_block_copies(self) -> BlockCopies:
        """The copy-on-write copies queued since the last call (partial prefix hits) and
        the blocks they keep referenced: run the copies, then release those blocks with
        ``block_pool.free_blocks(retained_blocks)`` (or ``release_cow_copies``)."""
        pairs = self.coordinator.take_cow_copies()
        copies = [BlockCopy(source, copy) for source, copy in pairs]
        return BlockCopies(copies, [block for pair in pairs for block in pair])

    def release_cow_copies(self) -> list[BlockCopy]:
        """Take the queued copies and release their blocks at once (an engine that copies
        within the same step, before anything else is allocated)."""
        copies, retained = self.take_kv_cache_block_copies()
        self.block_pool.free_blocks(retained)
        return copies

    def cache_blocks(self, request: Request, num_computed_tokens: int) -> None:
        """Cache the request's full blocks up to ``num_computed_tokens`` (hybrid models: up
        to a multiple of the scheduler block size; their EAGLE groups up to one of their
        blocks past it). Speculative decoding calls it after verification, with the
        computed tokens rolled back by the rejected drafts."""
        if self.enable_caching:
            self.coordinator.cache_blocks(request, num_computed_tokens)

    def set_prefix_cache_retention_interval(self, interval: int | None) -> None:
        """Change how densely sliding-window and Mamba groups keep states for later hits
        (``CacheConfig.prefix_cache_retention_interval``'s rules); applies from the next
        step's caching on."""
        check_retention_interval(interval, self.scheduler_block_size, self.managers)
        self.coordinator.set_retention_interval(interval)

    def offer_boundary_states(self) -> None:
        """Start recording the Mamba align states this manager keys, for a KV connector
        to drain with ``take_boundary_state_offloads`` (docs/runtime.md)."""
        self.coordinator.offer_boundary_states()

    def take_boundary_state_offloads(self) -> dict[str, list[tuple[int, int, int]]]:
        """The boundary states keyed since the last call, per request: ``(group_id,
        block_id, boundary_tokens)`` in group order ({} unless ``offer_boundary_states``)."""
        return self.coordinator.take_boundary_state_offloads()

    def finalize_partial_tail_offloads(
        self, request_id: str, num_computed_tokens: int, num_in_flight_tokens: int = 0
    ) -> list[tuple[int, int, int]]:
        """For a finishing request: its own uncopied partial tails still holding the
        prompt's boundary state, as ``(group_id, block_id, boundary_tokens)`` (each once)."""
        return self.coordinator.finalize_partial_tail_offloads(
            request_id, num_computed_tokens, num_in_flight_tokens
        )

    def __repr__(self) -> str:
        kinds = ", ".join(kind for kind, _ in self._group_meta)
        return (
            f"KVCacheManager(groups=[{kinds}], num_blocks={self.block_pool.num_blocks}, "
            f"caching={self.enable_caching})"
        )


def retention_class(name: str) -> type[Retention]:
    """The ``Retention`` named in ``config.PREFIX_CACHE_RETENTIONS``, imported by name (an
    extension's module is loaded only when chosen; the core never imports it)."""
    if name not in PREFIX_CACHE_RETENTIONS:
        known = ", ".join(PREFIX_CACHE_RETENTIONS)
        raise ConfigError(f"KVCacheManager retention must be one of {known}, got {name!r}")
    qualname = PREFIX_CACHE_RETENTIONS[name]
    module, _, attr = qualname.rpartition(".")
    cls = getattr(importlib.import_module(module), attr)
    if not (isinstance(cls, type) and issubclass(cls, Retention)):
        raise ConfigError(f"retention {name!r} ({qualname}) is not a Retention subclass")
    return cls


def check_retention_interval(
    interval: int | None, scheduler_block_size: int, managers: list[SingleTypeKVCacheManager]
) -> None:
    """vLLM's rule: None or 0 always; a positive interval only for a model with a
    sliding-window or Mamba group, and a multiple of the scheduler block size."""
    if interval is None or interval == 0:
        return
    name = "CacheConfig.prefix_cache_retention_interval"
    if not any(m.sparse_retention for m in managers):
        raise ConfigError(
            f"{name}={interval} has no effect: the model has no sliding-window or Mamba KV "
            "cache group (set it to 0)"
        )
    if interval < 0 or interval % scheduler_block_size:
        raise ConfigError(
            f"{name}={interval} must be a non-negative multiple of the scheduler block size "
            f"({scheduler_block_size} tokens)"
        )
