"""The running-request fast paths of ``allocate_slots``: a request that already holds
blocks only grows its tables, caches newly full blocks and frees blocks that left a window;
no hits to adopt, so the common decode step allocates nothing or one block per group."""

from __future__ import annotations

from collections.abc import Callable

from pagedkv.runtime.block_pool import BlockPool, Savepoint
from pagedkv.runtime.blocks import KVCacheBlocks
from pagedkv.runtime.hashing import BlockHasher
from pagedkv.runtime.managers.base import SingleTypeKVCacheManager
from pagedkv.runtime.request import Request


class RunningAllocator:
    """Running-request half of ``SlotAllocator`` (a mixin: the manager owns the state)."""

    managers: list[SingleTypeKVCacheManager]
    block_pool: BlockPool
    hasher: BlockHasher
    enable_caching: bool
    hash_block_size: int
    num_groups: int
    _same_block_size: SingleTypeKVCacheManager | None
    _lockstep: bool
    _skip_sets: list[tuple[SingleTypeKVCacheManager, list[SingleTypeKVCacheManager]]]
    _cross: list[bool]
    _no_hits: tuple[list[int], ...]
    _empty: KVCacheBlocks
    _transaction: Callable[..., KVCacheBlocks]  # SlotAllocator's

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
            if self._lockstep:
                return self._lockstep_transaction(request, num_new, num_main, cache_tokens)
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

    def _single_transaction(
        self,
        manager: SingleTypeKVCacheManager,
        request: Request,
        num_new: int,
        num_slots: int,
        num_main: int,
        cache: bool,
    ) -> KVCacheBlocks:
        """``_transaction`` for a running request of a one-group model, unrolled."""
        request_id = request.request_id
        table = manager.req_to_blocks[request_id]
        saved = (len(table), manager.num_cached_block[request_id])
        pool = self.block_pool
        savepoint = pool.begin()
        try:
            new = manager.allocate_new_blocks(request_id, num_slots) if num_new > 0 else []
            if cache:
                num_tokens = len(request.all_token_ids)
                manager.cache_blocks(request, num_main if num_main < num_tokens else num_tokens)
        except BaseException:
            pool.rollback(savepoint)
            manager.rollback(request_id, saved)
            raise
        pool.commit()
        return KVCacheBlocks((new,)) if new else self._empty

    def _lockstep_transaction(
        self, request: Request, num_new: int, num_main: int, cache_tokens: int
    ) -> KVCacheBlocks:
        """``_transaction`` for a running request whose groups share one block size (their
        tables grow in step): one pool allocation for every group, all or nothing."""
        request_id = request.request_id
        managers = self.managers
        pool = self.block_pool
        saved = [m.save(request_id) for m in managers]
        savepoint = pool.begin()
        try:
            if num_new > 0:
                # Group k gets the k-th run of blocks: the order per-group calls give.
                blocks = pool.get_new_blocks(num_new * len(managers))
                new_blocks = tuple(blocks[k : k + num_new] for k in range(0, len(blocks), num_new))
                for m, new in zip(managers, new_blocks):
                    m.req_to_blocks[request_id].extend(new)
            else:
                new_blocks = self._no_hits
            if cache_tokens >= 0:
                num_tokens = len(request.all_token_ids)
                num_cacheable = num_main if num_main < num_tokens else num_tokens
                for m in managers:
                    m.cache_blocks(request, num_cacheable)
        except BaseException:
            self._undo(request_id, savepoint, saved)
            raise
        pool.commit()
        return KVCacheBlocks(new_blocks) if num_new > 0 else self._empty

    def _undo(
        self, request_id: str, savepoint: Savepoint, saved: list[tuple[int, int] | None]
    ) -> None:
        """Revert a failed transaction: the pool's journal, then every group's table."""
        self.block_pool.rollback(savepoint)
        for m, state in zip(self.managers, saved):
            m.rollback(request_id, state)

    def _remove_skipped(self, request_id: str, num_computed_tokens: int) -> None:
        """Free blocks that left a window. Identical groups get the same table updates,
        so their nulls sit at the same positions: the first group's table tells whether
        any of them has a block to remove."""
        for probe, group in self._skip_sets:
            skipped = probe.get_num_skipped_tokens(num_computed_tokens)
            if skipped <= 0:
                continue
            last = skipped // probe.block_size
            table = probe.req_to_blocks[request_id]
            index = (last if last < len(table) else len(table)) - 1
            if index >= 0 and table[index]:
                for m in group:
                    m.remove_skipped_blocks(request_id, num_computed_tokens)
