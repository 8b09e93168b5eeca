"""``allocate_slots``: giving a request the blocks for its next tokens, all or nothing."""

from __future__ import annotations

from collections.abc import Callable

from pagedkv.errors import KVCacheRuntimeError
from pagedkv.runtime.block_pool import BlockPool
from pagedkv.runtime.blocks import KVCacheBlocks
from pagedkv.runtime.hashing import BlockHasher
from pagedkv.runtime.managers.base import SingleTypeKVCacheManager
from pagedkv.runtime.request import Request
from pagedkv.runtime.running import RunningAllocator


class SlotAllocator(RunningAllocator):
    """Allocation half of ``KVCacheManager`` (a mixin: the manager owns the state)."""

    managers: list[SingleTypeKVCacheManager]
    block_pool: BlockPool
    hasher: BlockHasher
    enable_caching: bool
    max_model_len: int
    hash_block_size: int
    num_groups: int
    watermark_blocks: int
    _first_tables: dict[str, list[int]]
    _single: SingleTypeKVCacheManager | None
    _same_block_size: SingleTypeKVCacheManager | None
    _skipping: list[SingleTypeKVCacheManager]
    _skip_sets: list[tuple[SingleTypeKVCacheManager, list[SingleTypeKVCacheManager]]]
    _cross: list[bool]
    _no_hits: tuple[list[int], ...]
    _empty: KVCacheBlocks
    _attach_hasher: Callable[[Request], None]

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
        if num_new_tokens <= 0 or num_lookahead_tokens < 0:
            self._check_counts(
                request, num_new_tokens, num_new_computed_tokens, num_lookahead_tokens
            )
        max_len = self.max_model_len
        total_computed = request.num_computed_tokens + num_new_computed_tokens
        num_main = total_computed + num_new_tokens
        num_slots = num_main + num_lookahead_tokens
        if num_slots > max_len:
            if num_main > max_len:
                raise KVCacheRuntimeError(
                    f"request {request.request_id!r} needs slots for {num_main} tokens, more "
                    f"than max_model_len={max_len}"
                )
            num_slots = max_len  # lookahead (draft) slots are capped
        request_id = request.request_id
        if request_id in self._first_tables:
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
            return self._single_transaction(single, request, num_new, num_slots, num_main, cache)
        if num_new_computed_tokens and not (
            0 < total_computed <= request.num_tokens and num_new_computed_tokens > 0
        ):
            raise KVCacheRuntimeError(
                f"request {request_id!r} adopts {num_new_computed_tokens} computed tokens "
                f"after {request.num_computed_tokens}, but it has {request.num_tokens} tokens"
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

    @staticmethod
    def _check_counts(
        request: Request,
        num_new_tokens: int,
        num_new_computed_tokens: int,
        num_lookahead_tokens: int,
    ) -> None:
        if num_lookahead_tokens < 0:
            raise KVCacheRuntimeError(
                f"request {request.request_id!r}: num_lookahead_tokens must be >= 0, "
                f"got {num_lookahead_tokens}"
            )
        if num_new_tokens < 0 or (num_new_tokens == 0 and num_new_computed_tokens == 0):
            raise KVCacheRuntimeError(
                f"request {request.request_id!r}: num_new_tokens must be > 0 when there are "
                f"no computed tokens to adopt, got {num_new_tokens}"
            )

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
            self._undo(request_id, savepoint, saved)
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
