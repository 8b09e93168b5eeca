"""Coordinators: build the shared pool and one manager per group, combine the groups'
cache-hit searches into one hit length valid for every group, and do every per-group
step of a request (sizing, allocation, caching, freeing) for the KVCacheManager, with
vLLM's method names."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple

from pagedkv.errors import ConfigError, KVCacheRuntimeError, RegistryError
from pagedkv.planning.types import KVCacheConfig, KVCacheGroupSpec
from pagedkv.registry import KVCacheSpecRegistry
from pagedkv.runtime.block_pool import BlockPool
from pagedkv.runtime.free_queue import FreeQueue
from pagedkv.runtime.managers.base import HitQuery, SingleTypeKVCacheManager
from pagedkv.runtime.managers.cross import CrossAttentionManager
from pagedkv.runtime.managers.full import FullAttentionManager
from pagedkv.runtime.managers.mamba import MambaManager
from pagedkv.specs.base import KVCacheSpec
from pagedkv.specs.uniform import UniformTypeKVCacheSpecs

if TYPE_CHECKING:
    from pagedkv.runtime.hashing import BlockHash
    from pagedkv.runtime.request import Request

__all__ = [
    "group_behaviour_spec",
    "resolve_caching",
    "manager_class_for",
    "eagle_groups",
    "SpecGroup",
    "TableGrowth",
    "SpeculativeGrowth",
    "IdleStepCheck",
    "KVCacheCoordinator",
    "NoPrefixCacheCoordinator",
    "UnitaryCoordinator",
    "HybridCoordinator",
    "make_coordinator",
]


def group_behaviour_spec(group: KVCacheGroupSpec) -> KVCacheSpec:
    """The spec that decides a group's lifetime: a uniform-type group's first layer spec."""
    spec = group.kv_cache_spec
    if isinstance(spec, UniformTypeKVCacheSpecs):
        return spec.first_spec
    return spec


def resolve_caching(
    groups: Sequence[KVCacheGroupSpec], default: bool, enable_caching: bool | None
) -> bool:
    """``enable_caching``, or when None ``default`` unless a group's kind turns caching
    off (``KVCacheSpec.disables_prefix_caching``); groups that are merely never cached (a
    ring) stay out of the cache while the others cache."""
    specs = [group_behaviour_spec(g) for g in groups]
    if not specs:
        return False
    if enable_caching is None:
        return default and not any(s.disables_prefix_caching for s in specs)
    for gid, spec in enumerate(specs):
        if enable_caching and spec.disables_prefix_caching:
            raise ConfigError(
                f"enable_caching=True but KV cache group {gid} ({type(spec).__name__}, "
                f"kind {spec.kind!r}) cannot be prefix-cached"
            )
    return enable_caching


def manager_class_for(group: KVCacheGroupSpec, group_id: int) -> type[SingleTypeKVCacheManager]:
    spec = group_behaviour_spec(group)
    manager_cls = KVCacheSpecRegistry.get_manager_class(spec, role=group.role)
    if manager_cls is None:
        raise RegistryError(
            f"KV cache group {group_id} (layers {', '.join(group.layer_names[:3])}...): "
            f"no manager registered for spec type {type(spec).__name__}"
        )
    if not issubclass(manager_cls, SingleTypeKVCacheManager):
        raise RegistryError(
            f"KV cache group {group_id}: manager {manager_cls.__qualname__} does not "
            "subclass SingleTypeKVCacheManager"
        )
    return manager_cls


def eagle_groups(
    groups: Sequence[KVCacheGroupSpec], use_eagle: bool
) -> tuple[frozenset[int], frozenset[int]]:
    """The EAGLE groups (those holding draft layers, or every group when ``use_eagle`` and
    none is marked) and those of them whose hits drop the EAGLE block (none unless
    ``use_eagle``: lookahead block hashes make the drop unnecessary)."""
    marked = frozenset(gid for gid, group in enumerate(groups) if group.is_eagle_group)
    if use_eagle and not marked:
        marked = frozenset(range(len(groups)))
    return marked, (marked if use_eagle else frozenset())


class SpecGroup(NamedTuple):
    """Groups with equal spec and manager class, looked up together (all must hit);
    ``use_eagle``: one of them drops the EAGLE block, so the lookup does for all."""

    spec: KVCacheSpec
    group_ids: tuple[int, ...]
    manager_cls: type[SingleTypeKVCacheManager]
    use_eagle: bool = False


# One group's tables as the idle-step check reads them: (block_size, block tables by
# request id, leading blocks already cached by request id, sized by the encoder's tokens
# (cross attention)). Plain tuples: the interpreter unpacks those fastest.
TableGrowth = tuple[int, dict[str, list[int]], dict[str, int], bool]
# A Mamba group holding speculative blocks past its positions: (block_size, block tables,
# speculative blocks, "align" mode: counted from the main model's tokens, no lookahead).
SpeculativeGrowth = tuple[int, dict[str, list[int]], int, bool]


# One run of skipping managers of one class and spec, in the order the coordinator frees
# their skipped blocks: (the run's first manager's ``remove_skipped_blocks``, bound; the
# peers it frees with; the first manager's ``skip_floor``, or None where its kind cannot
# tell when the next block leaves: then every step calls it; its ``next_skip_tokens``).
SkipStep = tuple[
    Callable[..., None],
    list[SingleTypeKVCacheManager],
    dict[str, int] | None,
    Callable[[int], int | None],
]


# A unitary coordinator's group that takes plain steps: (block tables by request id,
# leading blocks already cached by request id, block size, hash block size, group id,
# whether it caches).
PlainStep = tuple[dict[str, list[int]], dict[str, int], int, int, int, bool]


class IdleStepCheck(NamedTuple):
    """What tells, without asking any manager, that a running request's step changes
    nothing (no table grows, no block becomes full to cache): most decode steps. The
    ``KVCacheManager`` binds its parts once and runs it inline: it runs on every decode
    step, where a call's own cost is a sizeable part of the step.

    ``groups``: every group (each ``tracks_tokens``); ``counts_new_blocks``: every
    group needs exactly ``cdiv(tokens, block_size) - len(table)`` new blocks, so the
    check's count is the allocation's; ``cache_step``: cached tokens round down to it
    (never undercounting: 1 unless every group rounds); ``tail_keyers``: groups that
    also key the prompt's partial last block, asked when nothing else changes."""

    groups: list[TableGrowth]
    speculative: list[SpeculativeGrowth]
    counts_new_blocks: bool
    cache_step: int
    tail_keyers: list[FullAttentionManager]


class KVCacheCoordinator(ABC):
    """Owns the block pool and one manager per group, combines the groups' cache-hit
    searches (vLLM's fixed point: downward-closed kinds first, once; the others repeat
    within the current bound until no kind shortens the hit) and does every per-group
    step of a request for the ``KVCacheManager`` (vLLM's coordinator, method for
    method). The subclasses differ in the search and in how many computed tokens each
    group caches.

    Args:
        kv_cache_config: the model's groups and the pool's block count.
        enable_events: the block pool records KV cache events.
        free_queue: the pool's free-block order (None: vLLM's LRU queue).
        use_eagle: EAGLE speculative decoding: the groups whose hits drop the last
            matched block are chosen as vLLM does.
        num_prefill_lookahead: tokens past the computed ones the drafter reads; all but
            one are computed again later, so they are not written back as final.
        num_hash_lookahead_tokens: tokens past each block that its hash covers.
        scheduler_block_size: tokens hybrid models cache and chunk in multiples of
            (None: the cache-hit alignment).
        partial_hash_hits: hits may end inside a block; hybrid models then cache every
            full block instead of rounding to the scheduler block size.
        **manager_kwargs: every group manager's constructor keywords
            (``SingleTypeKVCacheManager``); ``enable_caching``, ``hash_block_size``,
            ``alignment_tokens`` and ``retention_interval`` are required.
    """

    eagle_margin: ClassVar[bool] = True  # an EAGLE lookup looks one block past the bound

    def __init__(
        self,
        kv_cache_config: KVCacheConfig,
        *,
        enable_events: bool = False,
        free_queue: FreeQueue | None = None,
        use_eagle: bool = False,
        num_prefill_lookahead: int = 0,
        num_hash_lookahead_tokens: int = 0,
        scheduler_block_size: int | None = None,
        partial_hash_hits: bool = False,
        **manager_kwargs: Any,
    ) -> None:
        self.enable_caching = manager_kwargs["enable_caching"]
        self.hash_block_size = manager_kwargs["hash_block_size"]
        self.alignment_tokens = alignment_tokens = manager_kwargs["alignment_tokens"]
        self.scheduler_block_size = scheduler_block_size or alignment_tokens
        groups_config = kv_cache_config.kv_cache_groups
        pool = BlockPool(
            kv_cache_config.num_blocks,
            self.enable_caching,
            self.hash_block_size,
            enable_events,
            free_queue=free_queue,
        )
        pool.num_hash_lookahead_tokens = num_hash_lookahead_tokens
        self.block_pool = pool
        self.managers: list[SingleTypeKVCacheManager] = [
            manager_class_for(group, gid)(
                group_behaviour_spec(group), pool, kv_cache_group_id=gid, **manager_kwargs
            )
            for gid, group in enumerate(groups_config)
        ]
        self.eagle_group_ids, self.drop_eagle_group_ids = eagle_groups(groups_config, use_eagle)
        # Multi-module MTP re-prefills the last ``lookahead - 1`` tokens: not yet final.
        self.num_reprefillable_tokens = max(0, num_prefill_lookahead - 1)
        self._check_eagle(num_prefill_lookahead)
        by_key: dict[tuple[Any, type], list[int]] = {}
        for gid, manager in enumerate(self.managers):
            if manager.enable_caching:
                by_key.setdefault((manager.kv_cache_spec, type(manager)), []).append(gid)
        drops = self.drop_eagle_group_ids
        groups = [
            SpecGroup(spec, tuple(ids), cls, not drops.isdisjoint(ids))
            for (spec, cls), ids in by_key.items()
        ]
        self.spec_groups = sorted(groups, key=lambda g: not g.manager_cls.downward_closed_hits)
        for sg in self.spec_groups:
            for gid in sg.group_ids:
                self.managers[gid].use_eagle = sg.use_eagle
        for manager in self.managers:
            manager.eagle_replay = bool(drops)
            manager.scheduler_block_size = self.scheduler_block_size
            if isinstance(manager, MambaManager):
                # Checkpoints land where an EAGLE lookup (or a lookahead hash) can resume.
                manager.drop_eagle_checkpoint_block = use_eagle
                manager.num_hash_lookahead_tokens = num_hash_lookahead_tokens
        self._searches = [
            (sg.manager_cls, sg.group_ids, (pool, sg.spec, alignment_tokens, self.hash_block_size))
            for sg in self.spec_groups
        ]
        self._one_pass = len(groups) == 2 and self.spec_groups[0].manager_cls.downward_closed_hits
        self._setup_request_steps(partial_hash_hits, manager_kwargs["retention_interval"])

    def _setup_request_steps(self, partial_hash_hits: bool, retention_interval: int | None) -> None:
        managers = self.managers
        # Request id -> the first group's block table: a request runs while it has one.
        self.block_tables: dict[str, list[int]] = managers[0].req_to_blocks if managers else {}
        self._encoder = [isinstance(m, CrossAttentionManager) for m in managers]
        # Runs of skipping managers of one class and spec share one skip count, in order.
        runs: list[tuple[SingleTypeKVCacheManager, list[SingleTypeKVCacheManager]]] = []
        for m in (m for m in managers if m.skips_tokens):
            if runs and _shares_skips(runs[-1][0], m):
                runs[-1][1].append(m)
            else:
                runs.append((m, []))
        # What ``remove_skipped_blocks`` runs (the KVCacheManager's decode step, inline).
        self.skip_steps: list[SkipStep] = [
            (
                first.remove_skipped_blocks,
                peers,
                first.skip_floor if _knows_next_skip(first) else None,
                first.next_skip_tokens,
            )
            for first, peers in runs
        ]
        self._caching = [m for m in managers if m.enable_caching]
        # Hybrid models cache up to a multiple of the scheduler block size (vLLM's rule),
        # or of nothing with partial hits (rounding would re-key a copied partial state).
        self.cache_step = 1
        if len(managers) > 1 and not partial_hash_hits:
            self.cache_step = self.scheduler_block_size
        self._checkpoints_at_prefill_end = self._last_chunk_checkpoints(retention_interval)
        # Several groups that all grow plainly take their new blocks in one pool call.
        self._grow_together = len(managers) > 1 and all(
            m.plain_growth and not encoder for m, encoder in zip(managers, self._encoder)
        )
        self.idle_step_check = self._make_idle_step_check()

    def _last_chunk_checkpoints(self, retention_interval: int | None) -> bool:
        # vLLM reserves Mamba prefill checkpoints on the prompt's last chunk only under
        # retention interval 0 (else on every chunk: prefill_end 0).
        return retention_interval == 0 and any(
            getattr(m, "has_checkpoint_blocks", False) for m in self.managers
        )

    def _make_idle_step_check(self) -> IdleStepCheck | None:
        # None unless every group's table ends at cdiv(tokens, block_size) entries after
        # a step and a step caches only blocks that became full.
        managers = self.managers
        if not managers or not all(m.tracks_tokens for m in managers):
            return None
        eagle = len(managers) > 1 and any(m.use_eagle for m in self._caching)
        return IdleStepCheck(
            groups=[
                (m.block_size, m.req_to_blocks, m.num_cached_block, encoder)
                for m, encoder in zip(managers, self._encoder)
            ],
            speculative=[
                (m.block_size, m.req_to_blocks, m.num_speculative_blocks, m.align)
                for m in managers
                if isinstance(m, MambaManager) and m.num_speculative_blocks
            ],
            counts_new_blocks=all(m.plain_growth for m in managers),
            # EAGLE groups of a hybrid cache one of their blocks past the rounding.
            cache_step=1 if eagle else self.cache_step,
            tail_keyers=[
                m
                for m in self._caching
                if isinstance(m, FullAttentionManager) and m.keys_partial_tails
            ],
        )

    def use_pool(self, group_id: int, pool: BlockPool) -> None:
        """Move group ``group_id``, holding no request yet, to a pool of its own (HiSparse's
        host group): it allocates, caches and is looked up there."""
        manager = self.managers[group_id]
        if manager.req_to_blocks:
            raise KVCacheRuntimeError(
                f"KV cache group {group_id} holds requests; move it to a pool before any"
            )
        manager.block_pool = pool
        manager.retention.block_pool = pool
        self._grow_together = False
        self._searches = [
            (cls, ids, (self.managers[ids[0]].block_pool, *where[1:]))
            for cls, ids, where in self._searches
        ]

    def _check_eagle(self, num_prefill_lookahead: int) -> None:
        for gid in sorted(self.drop_eagle_group_ids):
            manager = self.managers[gid]
            if manager.enable_caching and not manager.supports_eagle_block_drop:
                raise ConfigError(
                    f"KV cache group {gid} ({type(manager.kv_cache_spec).__name__}): the "
                    "EAGLE block drop (use_eagle=True) is not supported for this kind"
                )
        eagle_caching = self.enable_caching and self.eagle_group_ids
        if eagle_caching and self.scheduler_block_size < num_prefill_lookahead:
            raise ConfigError(
                f"num_prefill_lookahead={num_prefill_lookahead} (multi-module MTP) with "
                f"prefix caching needs a scheduler block size of at least that many "
                f"tokens, got {self.scheduler_block_size}"
            )

    # ------------------------------------------------------------ the cache-hit search
    def find_longest_cache_hit(
        self, block_hashes: list[BlockHash], max_length: int
    ) -> tuple[list[list[int]], int, int]:
        """Hit blocks per group, the hit length and the longest prefix some group had."""
        if self.drop_eagle_group_ids:
            return self._find_with_eagle_drop(block_hashes, max_length)
        return self._find_without_eagle_drop(block_hashes, max_length)

    def _find_without_eagle_drop(
        self, block_hashes: list[BlockHash], max_length: int
    ) -> tuple[list[list[int]], int, int]:
        # One kind (one group, or identical ones): its search is the answer.
        lists: list[list[int]] = [[] for _ in self.managers]
        if not self._searches:
            return lists, 0, 0
        cls, group_ids, where = self._searches[0]
        found, hit = cls.find_longest_cache_hit(
            HitQuery(block_hashes, max_length, group_ids, *where)
        )
        for gid, blocks in zip(group_ids, found):
            lists[gid] = blocks
        return lists, hit, hit

    def _eagle_margin(self, sg: SpecGroup) -> int:
        # What an EAGLE lookup drops: a hash block where hits end inside blocks, else a block.
        block_size = sg.spec.block_size
        if sg.manager_cls.supports_fine_grained_hits and self.alignment_tokens < block_size:
            return int(self.hash_block_size)
        return block_size

    def _find_with_eagle_drop(
        self, block_hashes: list[BlockHash], max_length: int
    ) -> tuple[list[list[int]], int, int]:
        # HybridCoordinator's fixed point, where an EAGLE spec group looks one block past
        # the bound (several groups only) and drops the block its hit ends on, once per
        # bound; with one group, the unitary drop.
        lists: list[list[int] | None] = [None] * len(self.managers)
        lengths = [0] * len(self.managers)
        num_hashed = len(block_hashes) * self.hash_block_size
        candidate = max_length
        longest = 0
        verified: set[int] = set()  # EAGLE spec groups whose drop holds at this bound
        while True:
            current = candidate
            for index, sg in enumerate(self.spec_groups):
                cls, first = sg.manager_cls, sg.group_ids[0]
                if cls.downward_closed_hits and lists[first] is not None:
                    current = min(current, lengths[first])
                    continue
                drop = sg.use_eagle and index not in verified
                bound = current
                if drop and cls.looks_past_eagle_block and self.eagle_margin:
                    bound = min(current + self._eagle_margin(sg), num_hashed)
                _, group_ids, where = self._searches[index]
                found, hit = cls.find_longest_cache_hit(
                    HitQuery(block_hashes, bound, group_ids, *where, drop_eagle_block=drop)
                )
                if drop:
                    verified.add(index)
                elif hit < current:
                    verified.clear()
                current = hit
                for gid, blocks in zip(group_ids, found):
                    lists[gid] = blocks
                    lengths[gid] = hit
                longest = max(longest, hit)
            if current >= candidate:
                break
            candidate = current
            if self._one_pass:
                break
        found_lists = [blocks or [] for blocks in lists]
        for sg in self.spec_groups:
            if sg.manager_cls.downward_closed_hits:
                keep = -(-candidate // sg.spec.block_size)  # cdiv inline: see _grow_table
                for gid in sg.group_ids:
                    del found_lists[gid][keep:]
        return found_lists, candidate, longest

    # ----------------------------------------------------------------- a request's steps
    def journal_tables(self, request_id: str) -> None:
        """At the start of a pool transaction: a rollback returns every group's table of
        the request to its length now and its count of cached blocks to its value now (a
        new request's are dropped), so a kind journals only its other changes."""
        saved = [
            (m, len(table), m.num_cached_block.get(request_id))
            if (table := m.req_to_blocks.get(request_id)) is not None
            else (m, None, None)
            for m in self.managers
        ]
        self.block_pool.record(_restore_tables, request_id, saved)

    def prefill_end_of(self, request: Request) -> int:
        """Where the request's prefill ends (a resumed request replays its outputs too);
        0 when no group takes prefill checkpoints or when every chunk does."""
        if not self._checkpoints_at_prefill_end:
            return 0
        return max(request.num_prompt_tokens, len(request.all_token_ids) - 1)

    def get_num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: Sequence[Sequence[int]],
        num_encoder_tokens: int,
        total_computed_tokens: int,
        num_tokens_main_model: int,
        apply_admission_cap: bool = False,
        prefill_end: int = 0,
    ) -> int:
        """Free-queue blocks an allocation up to ``num_tokens`` tokens takes, over every
        group (cross-attention groups: ``num_encoder_tokens``, once).

        Args:
            request_id: the request.
            num_tokens: tokens that need a slot, those already allocated included.
            new_computed_blocks: the cache hit the request adopts, one list per group.
            num_encoder_tokens: encoder tokens (cross-attention groups).
            total_computed_tokens: tokens computed once the hit is adopted.
            num_tokens_main_model: ``num_tokens`` less the lookahead (draft) tokens.
            apply_admission_cap: cap each group at the most blocks it holds at once
                (the whole-sequence admission check; cross attention is left out).
            prefill_end: where the prefill ends (``prefill_end_of``).
        """
        needed = 0
        for m, encoder, hit in zip(self.managers, self._encoder, new_computed_blocks):
            if not encoder:
                needed += m.get_num_blocks_to_allocate(
                    request_id,
                    num_tokens,
                    hit,
                    total_computed_tokens,
                    num_tokens_main_model,
                    apply_admission_cap,
                    prefill_end,
                )
            elif not apply_admission_cap:
                needed += m.get_num_blocks_to_allocate(
                    request_id, num_encoder_tokens, hit, 0, num_encoder_tokens
                )
        return needed

    def allocate_new_computed_blocks(
        self,
        request_id: str,
        new_computed_blocks: Sequence[Sequence[int]],
        total_computed_tokens: int,
        num_external_computed_tokens: int = 0,
    ) -> None:
        """Start a new request's tables with its cache hit, then give every group but
        cross attention blocks for the tokens a KV connector loads after it. Every group
        adopts its hit before any allocates, so no allocation can evict another group's
        hit blocks.

        Args:
            request_id: the request (new: it has no table yet).
            new_computed_blocks: the cache hit it adopts, one list per group.
            total_computed_tokens: tokens computed once the hit and the loaded tokens are
                adopted.
            num_external_computed_tokens: of those, the tokens a KV connector loads.
        """
        if not num_external_computed_tokens:
            for m, hit in zip(self.managers, new_computed_blocks):
                m.add_local_computed_blocks(request_id, hit, total_computed_tokens)
            return
        local = total_computed_tokens - num_external_computed_tokens
        for m, hit in zip(self.managers, new_computed_blocks):
            m.add_local_computed_blocks(request_id, hit, total_computed_tokens, local)
        for m, encoder in zip(self.managers, self._encoder):
            if not encoder:
                m.allocate_external_computed_blocks(request_id, total_computed_tokens)

    def allocate_new_blocks(
        self,
        request_id: str,
        num_tokens: int,
        num_tokens_main_model: int,
        num_encoder_tokens: int = 0,
    ) -> tuple[list[int], ...]:
        """Grow every group's table to ``num_tokens`` tokens (cross attention: to the
        encoder's tokens); returns the new block ids per group.

        Args:
            request_id: the request.
            num_tokens: tokens that need a slot, those already allocated included.
            num_tokens_main_model: ``num_tokens`` less the lookahead (draft) tokens.
            num_encoder_tokens: encoder tokens (cross-attention groups).
        """
        if self._grow_together:
            grown = self._grow_tables_together(request_id, num_tokens)
            if grown is not None:
                return grown
        return tuple(
            [
                m.allocate_new_blocks(
                    request_id, num_encoder_tokens if encoder else num_tokens, num_tokens_main_model
                )
                for m, encoder in zip(self.managers, self._encoder)
            ]
        )

    def _grow_tables_together(
        self, request_id: str, num_tokens: int
    ) -> tuple[list[int], ...] | None:
        """Every group's new blocks from one pop of the pool, handed out in group order
        (what one pop per group gives); None while a group still owes a partial-hit copy."""
        managers = self.managers
        tables = []
        counts = []
        total = 0
        for m in managers:
            if m._partial_hits and request_id in m._partial_hits:
                return None
            table = m.req_to_blocks[request_id]
            count = -(-num_tokens // m.block_size) - len(table)  # cdiv inline: every step
            tables.append(table)
            counts.append(count)
            if count > 0:
                total += count
        blocks = self.block_pool.get_new_blocks(total)
        grown: list[list[int]] = []
        start = 0
        for m, table, count in zip(managers, tables, counts):
            if count <= 0:
                grown.append([])
                continue
            new = blocks[start : start + count]
            start += count
            table.extend(new)
            if m.records_new_block_ids:
                m.record_new_block_ids(new)
            grown.append(new)
        return tuple(grown)

    @abstractmethod
    def cache_blocks(self, request: Request, num_computed_tokens: int) -> None:
        """Cache the request's full blocks among its first ``num_computed_tokens`` tokens
        (the subclasses say how many of them each group caches)."""

    def free(self, request_id: str, priority: int = 0) -> None:
        """Release every group's blocks of the request, last blocks first."""
        for m in self.managers:
            m.free(request_id, priority)

    def remove_skipped_blocks(
        self, request_id: str, num_computed_tokens: int, num_prompt_tokens: int | None = None
    ) -> None:
        """Free the blocks that fell out of the request's window in every group that skips
        tokens (groups of one class and spec share one skip count)."""
        running = request_id in self.block_tables
        for remove, peers, floors, next_skip in self.skip_steps:
            if floors is None:
                remove(request_id, num_computed_tokens, peers, num_prompt_tokens)
            elif num_computed_tokens >= floors.get(request_id, 0):
                remove(request_id, num_computed_tokens, peers, num_prompt_tokens)
                if running:  # a floor only for a table that exists now
                    floors[request_id] = next_skip(num_computed_tokens) or 0

    def new_step_starts(self) -> None:
        """A new engine step begins: every group resets its per-step state."""
        for m in self.managers:
            m.new_step_starts()

    def get_block_ids(self, request_id: str) -> tuple[list[int], ...]:
        """A copy of the request's block table, one list per group."""
        return tuple(list(m.req_to_blocks.get(request_id, ())) for m in self.managers)

    def take_cow_copies(self) -> list[tuple[int, int]]:
        """Every group's queued (source, copy) pairs of partial prefix hits."""
        return [pair for m in self.managers for pair in m.take_cow_copies()]

    def emit_cached_block_events(self, request: Request, hits: Sequence[Sequence[int]]) -> None:
        """Re-announce a cache hit per group, nulls included (``kv_cache_report_mode="full"``)."""
        for m, blocks in zip(self.managers, hits):
            if blocks:
                self.block_pool.emit_cached_block_events(
                    request, len(blocks), m.block_size, m.kv_cache_group_id
                )

    def set_retention_interval(self, interval: int | None) -> None:
        """Every group keeps states for later hits at ``interval`` from the next step's
        caching on (``CacheConfig.prefix_cache_retention_interval``)."""
        for m in self.managers:
            m.retention_interval = interval
        self._checkpoints_at_prefill_end = self._last_chunk_checkpoints(interval)

    # ------------------------------------------------ Mamba boundary states (KV connector)
    def offer_boundary_states(self) -> None:
        """Every Mamba group records the align states it keys, for a KV connector."""
        for m in self.managers:
            if isinstance(m, MambaManager):
                m.offer_boundary_states()

    def take_boundary_state_offloads(self) -> dict[str, list[tuple[int, int, int]]]:
        """The boundary states keyed since the last call, per request: ``(group_id,
        block_id, boundary_tokens)`` in group order."""
        out: dict[str, list[tuple[int, int, int]]] = {}
        for m in self.managers:
            offers = getattr(m, "offers", None)
            if offers is not None:
                for request_id, block, tokens in offers.take():
                    out.setdefault(request_id, []).append((m.kv_cache_group_id, block, tokens))
        return out

    def finalize_partial_tail_offloads(
        self, request_id: str, num_computed_tokens: int, num_in_flight_tokens: int = 0
    ) -> list[tuple[int, int, int]]:
        """A finishing request's own uncopied partial tails still holding the prompt's
        boundary state, as ``(group_id, block_id, boundary_tokens)`` (each once)."""
        out: list[tuple[int, int, int]] = []
        for m in self.managers:
            if isinstance(m, MambaManager):
                tail = m.finalize_partial_tail(
                    request_id, num_computed_tokens, num_in_flight_tokens
                )
                if tail is not None:
                    out.append((m.kv_cache_group_id, *tail))
        return out


class NoPrefixCacheCoordinator(KVCacheCoordinator):
    """Prefix caching off: never a hit, nothing cached. Any number of groups, or none."""

    def find_longest_cache_hit(
        self, block_hashes: list[BlockHash], max_length: int
    ) -> tuple[list[list[int]], int, int]:
        return [[] for _ in self.managers], 0, 0

    def cache_blocks(self, request: Request, num_computed_tokens: int) -> None:
        return None


class UnitaryCoordinator(KVCacheCoordinator):
    """One group: its manager's search is the answer (under EAGLE it drops its last block
    without looking past the bound first, as vLLM's unitary coordinator does). It caches
    every computed token but those multi-module MTP may re-prefill."""

    eagle_margin = False

    def _setup_request_steps(self, partial_hash_hits: bool, retention_interval: int | None) -> None:
        super()._setup_request_steps(partial_hash_hits, retention_interval)
        # The group's kind takes plain steps: ``step_plainly`` does a running request's
        # step in one call (most engines' most frequent call that changes anything).
        m = self.managers[0]
        self.plain_step: PlainStep | None = None
        if m.takes_plain_steps() and not self._encoder[0]:
            self.plain_step = (
                m.req_to_blocks,
                m.num_cached_block,
                m.block_size,
                m.hash_block_size,
                m.kv_cache_group_id,
                m.enable_caching,
            )

    def cache_blocks(self, request: Request, num_computed_tokens: int) -> None:
        num_tokens = max(0, num_computed_tokens - self.num_reprefillable_tokens)
        for m in self._caching:
            m.cache_blocks(request, num_tokens)

    def step_plainly(
        self, request: Request, num_tokens: int, num_computed_tokens: int, cache: bool
    ) -> tuple[list[int], ...]:
        """A running request's step when the group takes plain steps (``plain_step`` set):
        ``journal_tables``, ``allocate_new_blocks`` and ``cache_blocks`` in one call. A
        step that takes one block or caches one (a decode step's) changes one thing after
        every check and needs no transaction; any other runs inside one of the pool's,
        undone if anything raises. Returns the new blocks (one list). It opens its own
        transaction, so it is called outside one (``allocate_slots`` does).

        Args:
            request: the running request.
            num_tokens: tokens that need a slot, those already allocated included.
            num_computed_tokens: tokens computed after the step (``cache_blocks``').
            cache: cache the blocks that became full.
        """
        plain = self.plain_step
        if plain is None:
            raise KVCacheRuntimeError(f"{type(self.managers[0]).__name__} takes no plain steps")
        tables, cached_by_request, block_size, hash_block_size, group_id, caches = plain
        request_id = request.request_id
        pool = self.block_pool
        if pool.in_transaction:
            raise KVCacheRuntimeError("step_plainly opens its own transaction; call it outside one")
        table = tables[request_id]
        length = len(table)
        num_new = -(-num_tokens // block_size) - length  # cdiv inline: see _grow_table
        num_cached = num_full = cached_by_request[request_id]
        if cache and caches:
            num_final = num_computed_tokens - self.num_reprefillable_tokens
            num_hashed = len(request.block_hashes) * hash_block_size
            num_full = (num_final if num_final < num_hashed else num_hashed) // block_size
            if num_full < num_cached:
                num_full = num_cached
        if num_full == num_cached:
            if num_new <= 0:
                return ([],)
            if num_new == 1:
                block = pool.get_new_block()
                table.append(block)
                return ([block],)
        elif num_new <= 0 and num_full == num_cached + 1:
            pool.cache_full_block(request, table, num_cached, block_size, group_id)
            cached_by_request[request_id] = num_full
            return ([],)
        savepoint = pool.begin()
        try:
            pool.record(
                _restore_plain_table, table, length, cached_by_request, request_id, num_cached
            )
            new = pool.get_new_blocks(num_new) if num_new > 0 else []
            table.extend(new)
            if num_full > num_cached:
                pool.cache_full_blocks(request, table, num_cached, num_full, block_size, group_id)
                cached_by_request[request_id] = num_full
        except BaseException:
            pool.rollback(savepoint)
            raise
        pool.commit()
        return (new,)


class HybridCoordinator(KVCacheCoordinator):
    """Several groups, their hits combined by the fixed point. Each caches up to a
    multiple of the scheduler block size (``cache_step``; 1 with partial hash hits), its
    EAGLE groups up to one of their blocks past it."""

    def _find_without_eagle_drop(
        self, block_hashes: list[BlockHash], max_length: int
    ) -> tuple[list[list[int]], int, int]:
        if len(self._searches) <= 1:
            return super()._find_without_eagle_drop(block_hashes, max_length)
        lists: list[list[int]] = [[] for _ in self.managers]
        candidate = max_length
        longest = 0
        searched_once: dict[int, int] = {}
        while True:
            current = candidate
            for index, (cls, group_ids, where) in enumerate(self._searches):
                if index in searched_once:
                    current = min(current, searched_once[index])
                    continue
                found, hit = cls.find_longest_cache_hit(
                    HitQuery(block_hashes, current, group_ids, *where)
                )
                for gid, blocks in zip(group_ids, found):
                    lists[gid] = blocks
                if cls.downward_closed_hits:
                    searched_once[index] = hit
                current = hit
                if hit > longest:
                    longest = hit
            if current >= candidate:
                break
            candidate = current
            if self._one_pass:
                break
        for index in searched_once:
            sg = self.spec_groups[index]
            keep = -(-candidate // sg.spec.block_size)  # cdiv inline: see _grow_table
            for gid in sg.group_ids:
                del lists[gid][keep:]
        return lists, candidate, longest

    def cache_blocks(self, request: Request, num_computed_tokens: int) -> None:
        step = self.cache_step
        aligned = num_computed_tokens - num_computed_tokens % step
        final = max(0, num_computed_tokens - self.num_reprefillable_tokens)
        for m in self._caching:
            num_tokens = aligned
            if m.use_eagle and aligned:
                # The EAGLE lookup matches one block past an aligned hit before dropping it.
                num_tokens = min(final, final - final % step + m.block_size)
            m.cache_blocks(request, num_tokens)


def make_coordinator(kv_cache_config: KVCacheConfig, **kwargs: Any) -> KVCacheCoordinator:
    """No prefix cache when caching is off, unitary for one group, hybrid otherwise."""
    if not kwargs["enable_caching"]:
        return NoPrefixCacheCoordinator(kv_cache_config, **kwargs)
    if len(kv_cache_config.kv_cache_groups) == 1:
        return UnitaryCoordinator(kv_cache_config, **kwargs)
    return HybridCoordinator(kv_cache_config, **kwargs)


def _restore_tables(
    request_id: str, saved: list[tuple[SingleTypeKVCacheManager, int | None, int | None]]
) -> None:
    # (manager, table length, cached blocks); None: the request had none.
    for m, length, num_cached in saved:
        if length is None:
            m.req_to_blocks.pop(request_id, None)
        else:
            del m.req_to_blocks[request_id][length:]
        if num_cached is None:
            m.num_cached_block.pop(request_id, None)
        else:
            m.num_cached_block[request_id] = num_cached


def _restore_plain_table(
    table: list[int],
    length: int,
    cached_by_request: dict[str, int],
    request_id: str,
    num_cached: int,
) -> None:
    del table[length:]
    cached_by_request[request_id] = num_cached


def _shares_skips(first: SingleTypeKVCacheManager, other: SingleTypeKVCacheManager) -> bool:
    kind = type(first)
    return (
        type(other) is kind
        and kind.remove_skipped_blocks is SingleTypeKVCacheManager.remove_skipped_blocks
        and other.kv_cache_spec == first.kv_cache_spec
    )


def _knows_next_skip(manager: SingleTypeKVCacheManager) -> bool:
    # Only pagedkv's own skip (a prefix of nulls) is safe to leave out until the floor.
    kind = type(manager)
    return (
        kind.remove_skipped_blocks is SingleTypeKVCacheManager.remove_skipped_blocks
        and kind.next_skip_tokens is not SingleTypeKVCacheManager.next_skip_tokens
    )
