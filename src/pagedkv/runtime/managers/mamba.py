"""Mamba / linear-attention state. Mode "none": the state lives in the request's last
block. Mode "align" (vLLM 0.33's prefix caching): entry ``i`` is the state after token
``(i + 1) * block_size``; a step gets one real block, for its chunk's end, behind nulls.

Speculative decoding adds ``num_speculative_blocks`` (k) scratch blocks after the state:
"none" holds k more blocks; "align" gives a request's first allocation k more, and later
steps move the scratch blocks the table grows past to its end (vLLM's relocation)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pagedkv.runtime.block_pool import NULL_BLOCK
from pagedkv.runtime.managers.base import HitQuery, SingleTypeKVCacheManager
from pagedkv.specs.base import cdiv

if TYPE_CHECKING:
    from pagedkv.runtime.request import Request


class MambaManager(SingleTypeKVCacheManager):
    """State blocks: only the latest computed state (and retained checkpoints) is kept."""

    skips_tokens = True
    sparse_retention = True
    looks_past_eagle_block = False  # no draft model has Mamba layers: hits never drop

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.align = getattr(self.kv_cache_spec, "mamba_cache_mode", "none") == "align"
        self.num_speculative_blocks: int = getattr(self.kv_cache_spec, "num_speculative_blocks", 0)
        self._cached_this_step: set[Any] = set()  # hashes
        self._last_state: dict[str, int] = {}  # index of the block the current step reads
        self._retired: dict[str, int] = {}  # positions below this are all null
        self._allocated: set[str] = set()  # requests past their first allocation (align)

    @classmethod
    def find_longest_cache_hit(cls, query: HitQuery) -> tuple[list[list[int]], int]:
        block_size = query.spec.block_size
        hashes = query.hashes()
        get = query.block_pool.get_cached_block
        for i in range(min(query.max_length // block_size, len(hashes)) - 1, -1, -1):
            if ((i + 1) * block_size) % query.alignment_tokens:
                continue
            blocks = get(hashes[i], query.group_ids)
            if blocks is not None:
                return [[NULL_BLOCK] * i + [b] for b in blocks], (i + 1) * block_size
        return [[] for _ in query.group_ids], 0

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        return max(num_computed_tokens - 1, 0)

    def hit_block_range(self, num_tokens: int) -> tuple[int, int]:
        end = num_tokens // self.block_size
        return max(end - 1, 0), end

    def get_num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: Sequence[int],
        total_computed_tokens: int,
        num_tokens_main_model: int,
        apply_admission_cap: bool = False,
    ) -> int:
        pool = self.block_pool
        hits = new_computed_blocks
        if hits and pool.block_hash[hits[-1]] in self._cached_this_step:
            return pool.num_blocks + 1  # the state is written this step: not yet
        spec_blocks = self.num_speculative_blocks
        if self.align:
            num_new = cdiv(num_tokens_main_model, self.block_size) + spec_blocks
            num_new -= len(hits) + len(self.req_to_blocks.get(request_id, ()))
            if num_new > 0:
                first = request_id not in self._allocated
                num_new = min(num_new, 1 + spec_blocks if first else 1)
            refs = [pool.ref_cnt[b] for b in hits if b]
            # Negative when rejected drafts left the table longer than needed: vLLM adds
            # it to the other groups' counts as is.
            return num_new + refs.count(0)
        num_tokens += spec_blocks * self.block_size
        args = (num_tokens, hits, total_computed_tokens, num_tokens_main_model)
        return super().get_num_blocks_to_allocate(request_id, *args, apply_admission_cap)

    def allocate_new_blocks(
        self, request_id: str, num_tokens: int, num_tokens_main_model: int
    ) -> list[int]:
        spec_blocks = self.num_speculative_blocks
        if not self.align:
            num_tokens += spec_blocks * self.block_size
            return super().allocate_new_blocks(request_id, num_tokens, num_tokens_main_model)
        table = self.req_to_blocks[request_id]
        start = len(table)
        required = cdiv(num_tokens_main_model, self.block_size) + spec_blocks
        allocated = request_id in self._allocated
        pool = self.block_pool
        if required <= start:
            if not allocated:
                self._allocated.add(request_id)
                pool.record(self._allocated.discard, request_id)
            return []
        undo = (request_id, start, self._last_state.get(request_id), allocated)
        if allocated:
            # The running state sits before the speculative blocks: the block this step reads.
            self._last_state[request_id] = start - 1 - spec_blocks
        elif start > 0:
            self._last_state[request_id] = start - 1  # a hit's state
        state_index = required - spec_blocks - 1
        table.extend([NULL_BLOCK] * (state_index - start))
        moved = self._relocate_speculative_blocks(table, start, state_index) if allocated else []
        pool.record(self._undo_allocate, *undo, moved)
        returned = table[start:]
        new = pool.get_new_blocks(max(required - len(table), 0))
        table.extend(new)
        self._allocated.add(request_id)
        return returned + new

    def _relocate_speculative_blocks(
        self, table: list[int], start: int, state_index: int
    ) -> list[tuple[int, int]]:
        # Scratch blocks below the new state's position move to the table's end, in order.
        moved = []
        for index in range(start - self.num_speculative_blocks, start):
            if index >= state_index:
                break
            moved.append((index, table[index]))
            table.append(table[index])
            table[index] = NULL_BLOCK
        return moved

    def remove_skipped_blocks(
        self, request_id: str, num_computed_tokens: int, peers: Sequence[Any] = ()
    ) -> None:
        if not self.align:
            super().remove_skipped_blocks(request_id, num_computed_tokens, peers)
            return
        table = self.req_to_blocks.get(request_id)
        if not table:
            return
        first = self._retired.get(request_id, 0)
        last = min(self.get_num_skipped_tokens(num_computed_tokens) // self.block_size, len(table))
        if last > first:
            # Nulls sit between states: skip them instead of stopping.
            indices = [i for i in range(last - 1, first - 1, -1) if table[i]]
            if indices:
                blocks = [table[i] for i in indices]
                for i in indices:
                    table[i] = NULL_BLOCK
                self.retention.release(request_id, indices, blocks)
            self._retired[request_id] = last
        index = self._last_state.get(request_id)
        if index is not None and index < cdiv(num_computed_tokens, self.block_size) - 1:
            block = table[index]
            if block:
                table[index] = NULL_BLOCK
                self.retention.release(request_id, [index], [block])

    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        request_id = request.request_id
        first = self.num_cached_block[request_id]
        super().cache_blocks(request, num_tokens)
        last = self.num_cached_block[request_id]
        hashes = self.block_pool.block_hash
        this_step = self._cached_this_step
        added = {hashes[b] for b in self.req_to_blocks[request_id][first:last] if b}
        if self.align:
            added.add(self._cache_prompt_boundary(request, num_tokens))
        added.discard(None)
        added -= this_step
        if added:
            this_step |= added
            self.block_pool.record(this_step.difference_update, added)  # on rollback

    def _cache_prompt_boundary(self, request: Request, num_tokens: int) -> Any:
        # vLLM keys the state at the prompt's reusable boundary whenever a caching call
        # ends exactly there, even if sparse retention skipped it or ``evict_blocks``
        # dropped its hash since. Returns the hash it registered (None: nothing to do).
        boundary = prompt_checkpoint_position(
            request.num_prompt_tokens,
            self.hash_block_size,
            self.eagle_replay,
            self.block_pool.num_hash_lookahead_tokens,
        )
        if num_tokens <= 0 or num_tokens != boundary or num_tokens % self.block_size:
            return None
        index = num_tokens // self.block_size - 1
        table = self.req_to_blocks[request.request_id]
        if index >= len(table) or not table[index] or self.block_pool.block_hash[table[index]]:
            return None
        pool = self.block_pool
        pool.cache_full_blocks(
            request, table, index, index + 1, self.block_size, self.kv_cache_group_id
        )
        return pool.block_hash[table[index]]

    def free(self, request_id: str, priority: int = 0) -> None:
        self._last_state.pop(request_id, None)
        self._retired.pop(request_id, None)
        self._allocated.discard(request_id)
        super().free(request_id, priority)

    def new_step_starts(self) -> None:
        self._cached_this_step.clear()

    def _undo_allocate(
        self,
        request_id: str,
        length: int,
        last_state: int | None,
        allocated: bool,
        moved: list[tuple[int, int]],
    ) -> None:
        table = self.req_to_blocks[request_id]
        for index, block in moved:
            table[index] = block
        del table[length:]
        if last_state is None:
            self._last_state.pop(request_id, None)
        else:
            self._last_state[request_id] = last_state
        if not allocated:
            self._allocated.discard(request_id)


def prompt_checkpoint_position(
    num_tokens: int, hash_block_size: int, eagle_drop: bool, num_hash_lookahead_tokens: int
) -> int:
    """The prompt's reusable state boundary (tokens): the last hash-block boundary that
    leaves the tokens a lookup recomputes (one, or the lookahead hashes' tokens); under
    the EAGLE block drop, one hash block below the last boundary."""
    limit = num_tokens if eagle_drop else num_tokens - max(1, num_hash_lookahead_tokens)
    position = limit - limit % hash_block_size
    if eagle_drop:
        position -= hash_block_size
    return max(position, 0)
