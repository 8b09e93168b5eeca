"""The per-group manager interface, the algorithms every kind shares, and the retention
hook: which full blocks a manager caches and how it frees blocks (docs/runtime.md)."""

from __future__ import annotations

import bisect
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple

from pagedkv.runtime.block_pool import NULL_BLOCK, BlockPool
from pagedkv.specs.base import AttentionSpec
from pagedkv.specs.ring import CircularBufferSpec

__all__ = [
    "HitQuery",
    "SingleTypeKVCacheManager",
    "zeroed_on_allocation",
    "eagle_replay_boundaries",
    "Retention",
]

if TYPE_CHECKING:
    from pagedkv.runtime.hashing import BlockHash
    from pagedkv.runtime.request import Request
    from pagedkv.specs.base import KVCacheSpec


class HitQuery(NamedTuple):
    """One cache-hit search over the groups ``group_ids`` (which must all hit)."""

    block_hashes: list[BlockHash]
    max_length: int
    group_ids: tuple[int, ...]
    block_pool: BlockPool
    spec: KVCacheSpec
    alignment_tokens: int
    hash_block_size: int
    # EAGLE: the hit must not end on the last matched block (its draft KV read the token
    # after it); kinds that can, drop it (vLLM's ``drop_eagle_block``).
    drop_eagle_block: bool = False

    def hashes(self) -> list[BlockHash]:
        scale = self.spec.block_size // self.hash_block_size
        return self.block_hashes if scale == 1 else self.block_hashes[scale - 1 :: scale]


class SingleTypeKVCacheManager(ABC):
    """Block tables of one KV cache group; every kind takes the same constructor keywords.

    Args:
        kv_cache_spec: the group's layer spec (its block size and kind).
        block_pool: the pool the group takes blocks from.
        kv_cache_group_id: the group's index in the model's groups.
        enable_caching: cache full blocks and look up hits (only if the spec is
            prefix-cacheable).
        hash_block_size: tokens per block hash (None: the block size).
        alignment_tokens: cache hits end on multiples of it (None: the block size).
        max_model_len: tokens a request may reach (None: no admission cap).
        in_flight_tokens: tokens that may be scheduled but not yet computed; with
            ``max_model_len`` it caps the blocks a request of a local or HiSparse kind
            holds at once (None: 0).
        retention: the ``Retention`` class deciding what is cached and how blocks are
            freed (None: vLLM's).
        retention_interval: vLLM's ``prefix_cache_retention_interval``, in tokens; a
            ``sparse_retention`` kind caches only the blocks a hit at each multiple of it
            needs (0: only those a replay or shared-prefix hit needs; None: every aligned
            hit's).
        record_new_block_ids: queue the blocks this kind hands out for zeroing
            (vLLM's ``needs_kv_cache_zeroing``; only kinds the engine zeroes).
    """

    skips_tokens: ClassVar[bool] = False  # frees blocks of running requests
    downward_closed_hits: ClassVar[bool] = False  # a hit implies every shorter prefix hits
    # vLLM's prefix_cache_retention_interval thins what this kind caches (reachable_blocks).
    sparse_retention: ClassVar[bool] = False
    # Hits may end on a hash boundary inside a block (vLLM's partial hash hits).
    supports_fine_grained_hits: ClassVar[bool] = False
    # Under EAGLE the coordinator looks one block past the hit for kinds that drop it.
    looks_past_eagle_block: ClassVar[bool] = True
    supports_eagle_block_drop: ClassVar[bool] = True
    # A running request's step up to n tokens needs cdiv(n, block_size) - len(table) new
    # blocks and leaves the table that long. A kind that overrides allocate_new_blocks
    # or get_num_blocks_to_allocate is taken not to.
    plain_growth: ClassVar[bool] = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        own = vars(cls)
        if "allocate_new_blocks" in own or "get_num_blocks_to_allocate" in own:
            cls.plain_growth = False

    def __init__(
        self,
        kv_cache_spec: KVCacheSpec,
        block_pool: BlockPool,
        *,
        kv_cache_group_id: int = 0,
        enable_caching: bool = True,
        hash_block_size: int | None = None,
        alignment_tokens: int | None = None,
        max_model_len: int | None = None,
        in_flight_tokens: int | None = None,
        retention: type[Retention] | None = None,
        retention_interval: int | None = 0,
        record_new_block_ids: bool = False,
    ) -> None:
        self.kv_cache_spec = kv_cache_spec
        self.block_size = kv_cache_spec.block_size
        self.block_pool = block_pool
        self.kv_cache_group_id = kv_cache_group_id
        self.enable_caching = enable_caching and kv_cache_spec.prefix_cacheable
        self.hash_block_size = hash_block_size or self.block_size
        self.alignment_tokens = alignment_tokens or self.block_size
        self.max_model_len = max_model_len
        self.in_flight_tokens = in_flight_tokens
        self.req_to_blocks: dict[str, list[int]] = {}
        self.num_cached_block: dict[str, int] = {}
        # Request id -> computed tokens below which ``remove_skipped_blocks`` (this
        # manager and the peers the coordinator runs with it) frees nothing new; written
        # by the coordinator's skip step, dropped with the request's table.
        self.skip_floor: dict[str, int] = {}
        self.retention_interval = retention_interval
        self.retention = (retention or Retention)(self)
        # Partial hits: a request's table position whose shared block it copies on its
        # next allocation, and the (source, copy) pairs the engine has yet to copy.
        self._partial_hits: dict[str, tuple[int, int]] = {}
        self._cow_copies: list[tuple[int, int]] = []
        # Set by the coordinator: this group's hits drop the EAGLE block; every group
        # keeps the positions an EAGLE lookup resumes at (``replay_boundaries``).
        self.use_eagle = False
        self.eagle_replay = False
        self.scheduler_block_size = self.alignment_tokens
        # ``record_new_block_ids`` (vLLM's needs_kv_cache_zeroing): the engine zeroes the
        # blocks this kind hands out before use; ``take_new_block_ids`` drains them.
        self.records_new_block_ids = record_new_block_ids and zeroed_on_allocation(kv_cache_spec)
        self.new_block_ids: list[int] = []
        # After a step up to n tokens the table holds cdiv(n, block_size) entries and the
        # step cached only blocks that became full: the coordinator's idle-step check can
        # read this group's tables instead of asking it.
        self.tracks_tokens = self.plain_growth

    @classmethod
    @abstractmethod
    def find_longest_cache_hit(cls, query: HitQuery) -> tuple[list[list[int]], int]:
        """Longest aligned cached prefix hit in every group of ``query.group_ids``: one
        block list per group (nulls where not needed) and its length in tokens."""

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        """Leading tokens whose blocks this kind no longer needs."""
        return 0

    def next_skip_tokens(self, num_computed_tokens: int) -> int | None:
        """The fewest computed tokens at which ``remove_skipped_blocks`` may free more than
        at ``num_computed_tokens`` (None: at any count; no call may be left out)."""
        return None

    def max_admission_blocks(self) -> int | None:
        """The most blocks a request of this kind holds at once (None: unbounded)."""
        cap = getattr(self.kv_cache_spec, "max_admission_blocks_per_request", None)
        if cap is None or self.max_model_len is None:
            return None
        capped: int | None = cap(self.in_flight_tokens or 0, self.max_model_len)
        return capped

    def hit_block_range(self, num_tokens: int) -> tuple[int, int]:
        """Block indices a cache hit of ``num_tokens`` (aligned) tokens needs (default: none)."""
        return 0, 0

    def eagle_hit_block_range(self, num_tokens: int) -> tuple[int, int]:
        """``hit_block_range`` for a group whose hits drop the EAGLE block: kinds that
        match one block past the hit keep that block too."""
        return self.hit_block_range(num_tokens)

    def get_num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: Sequence[int],
        total_computed_tokens: int,
        num_tokens_main_model: int,
        apply_admission_cap: bool = False,
        prefill_end: int = 0,
    ) -> int:
        """Free-queue blocks an allocation up to ``num_tokens`` would consume.

        Args:
            request_id: the request to allocate for.
            num_tokens: tokens the table must cover after the step, lookahead included.
            new_computed_blocks: the hit's blocks a new request adopts (empty: none).
            total_computed_tokens: tokens computed before the step, the hit's and a KV
                connector's included.
            num_tokens_main_model: ``num_tokens`` without the lookahead tokens.
            apply_admission_cap: cap the count at ``max_admission_blocks`` (asking
                whether a whole sequence fits).
            prefill_end: the token the request's prefill ends at (0: take checkpoints
                on every chunk).
        """
        required = -(-num_tokens // self.block_size)  # cdiv inline: runs every step
        if apply_admission_cap:
            cap = self.max_admission_blocks()
            if cap is not None and cap < required:
                required = cap
        table = self.req_to_blocks.get(request_id)
        if table is not None:
            return max(required - len(table), 0)
        skipped = self.get_num_skipped_tokens(total_computed_tokens) // self.block_size
        num_new = max(required - max(skipped, len(new_computed_blocks)), 0)
        if not new_computed_blocks:
            return num_new
        if total_computed_tokens % self.block_size:
            num_new += 1  # the copy of the shared block the hit ends inside
        # Cached hits with no reference leave the free queue when adopted.
        kept = new_computed_blocks[skipped:] if skipped else new_computed_blocks
        refs = list(map(self.block_pool.ref_cnt.__getitem__, kept))
        return num_new + refs.count(0) - kept.count(NULL_BLOCK)

    def add_local_computed_blocks(
        self,
        request_id: str,
        new_computed_blocks: Sequence[int],
        total_computed_tokens: int,
        num_local_computed_tokens: int | None = None,
    ) -> None:
        """Start the request's table with its cache hits (touched), nulls where skipped.

        Args:
            request_id: the new request.
            new_computed_blocks: the hit's blocks, one per table position.
            total_computed_tokens: tokens computed before the step, the tokens a KV
                connector loads after the hit included.
            num_local_computed_tokens: where the hit ends, when a KV connector loads
                tokens after it (None: at ``total_computed_tokens``).
        """
        skipped = self.get_num_skipped_tokens(total_computed_tokens) // self.block_size
        kept = list(new_computed_blocks[skipped:])
        if kept:
            self.block_pool.touch(kept)
        table = [NULL_BLOCK] * skipped + kept if skipped else kept
        self.req_to_blocks[request_id] = table
        self.num_cached_block[request_id] = len(table)
        local = num_local_computed_tokens
        if local is None:
            local = total_computed_tokens
        if kept and local % self.block_size:
            # The hit ends inside its last block: the request copies it before writing.
            index = local // self.block_size
            self._set_partial(request_id, index, kept[-1])
            self.num_cached_block[request_id] = index

    def allocate_external_computed_blocks(
        self, request_id: str, total_computed_tokens: int
    ) -> None:
        """Blocks for the tokens a KV connector loads, up to ``total_computed_tokens``
        (after the adopted hits); none where they fall outside the window."""
        if self.get_num_skipped_tokens(total_computed_tokens) < total_computed_tokens:
            self._grow_table(self.req_to_blocks[request_id], total_computed_tokens)

    def allocate_new_blocks(
        self, request_id: str, num_tokens: int, num_tokens_main_model: int
    ) -> list[int]:
        """Extend the table to cover ``num_tokens`` tokens; returns the new block ids."""
        if self._partial_hits and request_id in self._partial_hits:
            copy = self._copy_partial_hit(request_id)
            return [copy, *self.allocate_new_blocks(request_id, num_tokens, num_tokens_main_model)]
        new = self._grow_table(self.req_to_blocks[request_id], num_tokens)
        if new and self.records_new_block_ids:
            self.record_new_block_ids(new)
        return new

    def _grow_table(self, table: list[int], num_tokens: int) -> list[int]:
        """Append the new blocks ``table`` needs to cover ``num_tokens`` tokens; returns
        them (a rollback truncates the table: ``KVCacheCoordinator.journal_tables``)."""
        # cdiv written inline here and on the rest of the request path: a step or a lookup
        # stays in the runtime's own files (tests/runtime/test_call_path.py).
        num_new = -(-num_tokens // self.block_size) - len(table)
        if num_new <= 0:
            return []
        new = self.block_pool.get_new_blocks(num_new)
        table.extend(new)
        return new

    def record_new_block_ids(self, blocks: Sequence[int]) -> None:
        """Queue ``blocks`` for zeroing (undone with the allocation)."""
        ids = self.new_block_ids
        self.block_pool.record(self._truncate, ids, len(ids))
        ids.extend(blocks)

    def take_new_block_ids(self) -> list[int]:
        """The blocks handed out since the last call, for the engine to zero (always
        empty unless the manager ``records_new_block_ids``)."""
        ids, self.new_block_ids = self.new_block_ids, []
        return ids

    def _copy_partial_hit(self, request_id: str) -> int:
        """Give the request a private copy of the shared block its hit ends inside."""
        index, source = self._partial_hits[request_id]
        copy = self.block_pool.get_new_blocks(1)[0]
        self._pop_partial(request_id)
        self._apply_copy(request_id, index, source, copy)
        if self.records_new_block_ids:
            self.record_new_block_ids([copy])
        return copy

    def _apply_copy(self, request_id: str, index: int, source: int, copy: int) -> None:
        """The table points at ``copy`` instead of ``source``; both stay referenced until the
        engine copied (``take_cow_copies``): ``source`` by the hit, ``copy`` once more."""
        table = self.req_to_blocks[request_id]
        pool = self.block_pool
        pool.record(table.__setitem__, index, table[index])
        table[index] = copy
        self._queue_copy(source, copy)
        pool.ref_cnt[copy] += 1
        pool.record(pool.ref_cnt.__setitem__, copy, pool.ref_cnt[copy] - 1)

    def _queue_copy(self, source: int, copy: int) -> None:
        self._cow_copies.append((source, copy))
        self.block_pool.record(self._cow_copies.pop)

    def take_cow_copies(self) -> list[tuple[int, int]]:
        """The (source, copy) block pairs queued since the last call; each block keeps one
        reference for the copy, which the caller drops once the copy has run."""
        copies, self._cow_copies = self._cow_copies, []
        return copies

    def _set_partial(self, request_id: str, index: int, source: int) -> None:
        self.block_pool.record(
            self._restore_partial, request_id, self._partial_hits.get(request_id)
        )
        self._partial_hits[request_id] = (index, source)

    def _pop_partial(self, request_id: str) -> None:
        old = self._partial_hits.pop(request_id, None)
        if old is not None:
            self.block_pool.record(self._restore_partial, request_id, old)

    def _restore_partial(self, request_id: str, partial: tuple[int, int] | None) -> None:
        if partial is None:
            self._partial_hits.pop(request_id, None)
        else:
            self._partial_hits[request_id] = partial

    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        """Cache the full blocks among the first ``num_tokens`` tokens."""
        request_id = request.request_id
        num_cached = self.num_cached_block[request_id]
        num_full = min(num_tokens, len(request.block_hashes) * self.hash_block_size)
        num_full //= self.block_size
        if num_full <= num_cached:
            return
        keep = self.retention.blocks_to_cache(self, request, num_cached, num_full)
        pool = self.block_pool
        pool.cache_full_blocks(
            request,
            self.req_to_blocks[request_id],
            num_cached,
            num_full,
            self.block_size,
            self.kv_cache_group_id,
            keep,
        )
        self.num_cached_block[request_id] = num_full

    def takes_plain_steps(self) -> bool:
        """Whether a running request's step here is only: grow the table to
        ``cdiv(tokens, block_size)`` blocks, then cache every block that became full, as
        ``cache_blocks`` counts them (a unitary coordinator then takes the step itself).
        False for a kind or retention that overrides any part of it."""
        kind = type(self)
        return kind.cache_blocks is SingleTypeKVCacheManager.cache_blocks and self._plain_parts()

    def _plain_parts(self) -> bool:
        kind = type(self)
        return (
            kind.plain_growth
            and kind.reachable_blocks is SingleTypeKVCacheManager.reachable_blocks
            and type(self.retention).blocks_to_cache is Retention.blocks_to_cache
            and not self.records_new_block_ids
        )

    def reachable_blocks(self, request: Request, start: int, end: int) -> set[int] | None:
        """Table positions in ``[start, end)`` vLLM's retention caches (None: every one).
        Kinds with ``sparse_retention`` thin them by ``retention_interval``."""
        return None

    def replay_boundaries(self, request: Request) -> tuple[int, ...]:
        """Token positions a later request can resume at: a resend of the prompt (its last
        token recomputed) and the shared-prefix junction, if any. Under EAGLE a lookup
        drops the block it ends on: a resend and a longer sibling each land one aligned
        block lower, and (in an EAGLE group) a sibling diverging right after the junction
        one block below it."""
        if self.eagle_replay:
            block = self.scheduler_block_size  # hits land on these, not on hash blocks
            boundaries = eagle_replay_boundaries(request.num_prompt_tokens, block)
        else:
            boundaries = (request.num_prompt_tokens - 1,)
        junction = request.shared_prefix_boundary
        if junction:
            extra = (junction, junction - self.block_size) if self.use_eagle else (junction,)
            boundaries = (*boundaries, *extra)
        return boundaries

    def boundary_blocks(
        self, request: Request, start: int, end: int, *more_boundaries: int
    ) -> set[int]:
        """Table positions in ``[start, end)`` a hit at the prompt's replay boundaries, the
        shared-prefix junction or ``more_boundaries`` (in tokens) needs."""
        keep: set[int] = set()
        block_range = self.eagle_hit_block_range if self.use_eagle else self.hit_block_range
        for boundary in (*self.replay_boundaries(request), *more_boundaries):
            if boundary >= 0:
                lo, hi = block_range(boundary - boundary % self.alignment_tokens)
                keep.update(range(max(lo, start), min(hi, end)))
        return keep

    def free(self, request_id: str, priority: int = 0) -> None:
        """Release the request's blocks, last first (the tail is evicted first)."""
        table = self.req_to_blocks.pop(request_id, None)
        self.num_cached_block.pop(request_id, None)
        self.skip_floor.pop(request_id, None)
        if self._partial_hits:
            self._partial_hits.pop(request_id, None)
        if table:
            # A reversed copy (a caller may still hold the table: vLLM's tests do), without
            # the leading nulls a window group's skipped prefix leaves.
            start = leading_nulls(table)
            blocks = table[start:]
            blocks.reverse()
            self.retention.release(
                request_id, range(len(table) - 1, start - 1, -1), blocks, priority
            )
        self.retention.forget(request_id)

    def pop_blocks_for_free(self, request_id: str) -> list[int]:
        """Forget the request and hand its table over (allocation order) unreleased: the
        caller frees the blocks through the pool, last first."""
        table = self.req_to_blocks.pop(request_id, None) or []
        self.num_cached_block.pop(request_id, None)
        self.skip_floor.pop(request_id, None)
        if self._partial_hits:
            self._partial_hits.pop(request_id, None)
        self.retention.forget(request_id)
        return table

    def remove_skipped_blocks(
        self,
        request_id: str,
        num_computed_tokens: int,
        peers: Sequence[Any] = (),
        num_prompt_tokens: int | None = None,
    ) -> None:
        """Null and free the blocks this kind no longer needs (a prefix), highest first;
        then the same for ``peers``, in order.

        Args:
            request_id: the running request.
            num_computed_tokens: tokens computed so far; the kind's skipped tokens
                follow from it.
            peers: more managers of this class and spec that skip the same tokens.
            num_prompt_tokens: the request's prompt length, read by kinds that free a
                middle range (R-SWA).
        """
        skipped = self.get_num_skipped_tokens(num_computed_tokens)
        if skipped <= 0:
            return
        for m in (self, *peers) if peers else (self,):
            table = m.req_to_blocks.get(request_id)
            last = skipped // m.block_size
            if table and last > len(table):
                last = len(table)
            if not table or last <= 0 or table[last - 1] == NULL_BLOCK:
                continue
            # Back from the last skipped block to the nulls of earlier skips (a step
            # frees a block or two; copying the whole prefix would cost its length).
            start = last - 1
            while start and table[start - 1] != NULL_BLOCK:
                start -= 1
            blocks = table[start:last]
            blocks.reverse()
            table[start:last] = [NULL_BLOCK] * len(blocks)
            m.retention.release(request_id, range(last - 1, start - 1, -1), blocks)

    def new_step_starts(self) -> None:  # noqa: B027 - optional hook
        """A new engine step begins (kinds that track per-step state reset it)."""

    @staticmethod
    def _truncate(table: list[int], length: int) -> None:
        del table[length:]


def zeroed_on_allocation(spec: KVCacheSpec) -> bool:
    """Whether the engine zeroes this kind's new blocks when the cache needs zeroing
    (vLLM's rule): attention blocks are, except a ring buffer's (a request reads only
    slots it wrote); state and wrapped groups are not."""
    return isinstance(spec, AttentionSpec) and not isinstance(spec, CircularBufferSpec)


def leading_nulls(table: list[int]) -> int:
    """How many null blocks the table starts with (a window group's skipped prefix)."""
    if not table or table[0] != NULL_BLOCK:
        return 0
    # Nulls usually form one leading run: bisect for its end as if the table were sorted
    # (nulls first), then confirm the guess at C speed; scan only if it was wrong.
    end = bisect.bisect_left(table, True, key=bool)
    if table[:end].count(NULL_BLOCK) == end and (end == len(table) or table[end]):
        return end
    return next((i for i, block in enumerate(table) if block), len(table))


def eagle_replay_boundaries(num_prompt_tokens: int, alignment_tokens: int) -> tuple[int, ...]:
    """Where a resend of the prompt (hit at most ``num_prompt_tokens - 1``) and a longer
    sibling (matching the prompt's last aligned block) resume under the EAGLE drop: one
    aligned block lower each."""
    resend = (num_prompt_tokens - 1) // alignment_tokens * alignment_tokens
    extension = num_prompt_tokens // alignment_tokens * alignment_tokens
    lower = {max(resend - alignment_tokens, 0), max(extension - alignment_tokens, 0)}
    return tuple(sorted(lower))


class Retention:
    """Which full blocks a manager caches and how it frees blocks; one per manager (holding
    no reference to it). This base is vLLM 0.33's (``"vllm"``): a ``sparse_retention`` kind
    caches the blocks its ``reachable_blocks`` names for the manager's retention interval;
    freed blocks go to the pool in the order given. Others: ``config.PREFIX_CACHE_RETENTIONS``."""

    def __init__(self, manager: SingleTypeKVCacheManager) -> None:
        self.block_pool = manager.block_pool

    def blocks_to_cache(
        self, manager: SingleTypeKVCacheManager, request: Request, start: int, end: int
    ) -> set[int] | None:
        """Table positions in ``[start, end)`` to cache now (None: every one). Runs inside
        an allocation: change any state of its own through ``block_pool.on_commit``.

        Args:
            manager: the group's manager.
            request: the request whose blocks become full.
            start: the first table position to consider (the blocks before are cached).
            end: the table position the full blocks end before.
        """
        return manager.reachable_blocks(request, start, end)

    def release(
        self, request_id: str, indices: Sequence[int], blocks: list[int], priority: int = 0
    ) -> None:
        """Free ``blocks``, first given first.

        Args:
            request_id: the request the blocks belonged to.
            indices: the blocks' table positions, in the order of ``blocks``.
            blocks: the block ids to free (nulls included).
            priority: the request's priority (vLLM's: lower is more important).
        """
        self.block_pool.free_blocks(blocks, priority)

    def forget(self, request_id: str) -> None:
        """The request's table is gone (after its last ``release``)."""
