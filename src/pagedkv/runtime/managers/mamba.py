"""Mamba / linear-attention state. Mode "none": the state lives in the request's last
block. Mode "align" (vLLM 0.33's prefix caching): entry ``i`` is the state after token
``(i + 1) * block_size``; a step gets one real block, for its chunk's end, behind nulls.

Align mode may also take a prefill checkpoint (spec ``num_prefill_checkpoint_blocks``): a
prompt's last chunk runs past its last hash boundary and the kernel exports the state at
that boundary into one more block, next to the running state (docs/runtime.md)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pagedkv.errors import KVCacheRuntimeError
from pagedkv.runtime.block_pool import NULL_BLOCK
from pagedkv.runtime.boundary_states import BoundaryStateOffers
from pagedkv.runtime.managers.base import HitQuery, SingleTypeKVCacheManager
from pagedkv.specs.base import cdiv
from pagedkv.specs.mamba import prefill_checkpoint_exportable, prefill_checkpoint_position

__all__ = [
    "MambaManager",
]

if TYPE_CHECKING:
    from pagedkv.runtime.hashing import BlockHash
    from pagedkv.runtime.request import Request


class MambaManager(SingleTypeKVCacheManager):
    """State blocks: only the latest computed state (and retained checkpoints) is kept."""

    skips_tokens = True
    sparse_retention = True
    supports_fine_grained_hits = True
    looks_past_eagle_block = False  # no draft model has Mamba layers: hits never drop

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        spec = self.kv_cache_spec
        self.align = getattr(spec, "mamba_cache_mode", "none") == "align"
        self.num_speculative_blocks: int = getattr(spec, "num_speculative_blocks", 0)
        self.checkpoint_alignment: int | None = getattr(spec, "prefill_checkpoint_alignment", None)
        self.has_checkpoint_blocks = (
            self.align and getattr(spec, "num_prefill_checkpoint_blocks", 0) > 0
        )
        # Speculative decoding sets these (EAGLE's replay boundary, lookahead hashes).
        self.drop_eagle_checkpoint_block = False
        self.num_hash_lookahead_tokens = 0
        # Not when cache_blocks also keys states that end inside a step (checkpoints, a
        # prompt tail finer than the block): then only the manager can tell an idle step.
        self.tracks_tokens = not (
            self.align
            and (
                self.has_checkpoint_blocks
                or self.hash_block_size != self.block_size
                or self.alignment_tokens != self.hash_block_size
            )
        )
        self._cached_this_step: set[BlockHash] = set()
        self._last_state: dict[str, int] = {}  # index of the block the current step reads
        self._retired: dict[str, int] = {}  # positions below this are all null
        self._allocated: set[str] = set()  # requests that allocated a step (not only hits)
        # The checkpoint the latest allocation reserves: (token position, table index).
        self._checkpoints: dict[str, tuple[int, int]] = {}
        # Keyed states offered to a KV connector (align mode, opt-in; None: off).
        self.offers: BoundaryStateOffers | None = None

    @classmethod
    def find_longest_cache_hit(cls, query: HitQuery) -> tuple[list[list[int]], int]:
        block_size = query.spec.block_size
        unit = query.alignment_tokens
        if unit < block_size and block_size % unit == 0:
            return cls._find_partial_hit(query)
        hashes = query.hashes()
        get = query.block_pool.get_cached_block
        for i in range(min(query.max_length // block_size, len(hashes)) - 1, -1, -1):
            if ((i + 1) * block_size) % query.alignment_tokens:
                continue
            blocks = get(hashes[i], query.group_ids)
            if blocks is not None:
                return [[NULL_BLOCK] * i + [b] for b in blocks], (i + 1) * block_size
        return [[] for _ in query.group_ids], 0

    @classmethod
    def _find_partial_hit(cls, query: HitQuery) -> tuple[list[list[int]], int]:
        # Hits end on any hash boundary: the state there sits in the block it ends in.
        unit = query.alignment_tokens
        per_block = query.spec.block_size // unit
        hashes = query.block_hashes
        get = query.block_pool.get_cached_block
        for i in range(min(query.max_length // unit, len(hashes)) - 1, -1, -1):
            blocks = get(hashes[i], query.group_ids)
            if blocks is not None:
                nulls = [NULL_BLOCK] * (i // per_block)
                return [[*nulls, b] for b in blocks], (i + 1) * unit
        return [[] for _ in query.group_ids], 0

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        return max(num_computed_tokens - 1, 0)

    def hit_block_range(self, num_tokens: int) -> tuple[int, int]:
        end = num_tokens // self.block_size
        return max(end - 1, 0), end

    def reachable_blocks(self, request: Request, start: int, end: int) -> set[int] | None:
        """``reachable_positions`` for this manager and the request's replay boundaries."""
        keep = self.reachable_positions(
            self.block_size, start, end, self.alignment_tokens, self.retention_interval
        )
        if keep is None:
            return None
        return keep | self.boundary_blocks(request, start, end)

    @staticmethod
    def reachable_positions(
        block_size: int,
        start: int,
        end: int,
        alignment_tokens: int,
        retention_interval: int | None,
        boundaries: Sequence[int] = (),
    ) -> set[int] | None:
        """Table positions in ``[start, end)`` a hit can use (None: every one). A hit needs
        only the state ending on it: the last block of every ``retention_interval``
        tokens and the block ending on each of ``boundaries`` (token positions, floored
        to ``alignment_tokens``).

        Args:
            block_size: the group's tokens per block.
            start: the first table position to consider.
            end: the table position to stop before.
            alignment_tokens: hits end on multiples of it.
            retention_interval: tokens between kept states (0: none but the
                boundaries'; None: keep every position).
            boundaries: token positions a hit must be able to resume at.
        """
        if retention_interval is None:
            return None
        keep: set[int] = set()
        if retention_interval:
            per_segment = retention_interval // block_size
            if per_segment <= 1:
                return None
            first = (start + per_segment) // per_segment * per_segment - 1
            keep.update(range(first, end, per_segment))
        for boundary in boundaries:
            block = boundary // alignment_tokens * alignment_tokens // block_size - 1
            if start <= block < end:
                keep.add(block)
        return keep

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
        """Free-queue blocks the allocation consumes. Not "align": the base count with the
        speculative blocks' tokens added. "align": a block for the chunk's end state,
        one for a partial hit's copy and one for a prefill checkpoint, at most. A hit
        on a state written this step counts more than the pool holds (no fit yet).

        Args:
            request_id: the request to allocate for.
            num_tokens: tokens the table must cover after the step, lookahead included
                ("align" reads ``num_tokens_main_model`` instead).
            new_computed_blocks: the hit's blocks a new request adopts (empty: none).
            total_computed_tokens: tokens computed before the step.
            num_tokens_main_model: ``num_tokens`` without the lookahead tokens (draft
                models have no Mamba layers).
            apply_admission_cap: the caller asks whether a whole sequence fits: the
                count is capped at ``max_admission_blocks`` (not "align") and no
                checkpoint is recorded for the allocation ("align").
            prefill_end: the token the request's prefill ends at (0: take checkpoints
                on every chunk).
        """
        pool = self.block_pool
        hits = new_computed_blocks
        if hits and pool.block_hash[hits[-1]] in self._cached_this_step:
            return pool.num_blocks + 1  # the state is written this step: not yet
        if not self.align:
            if self.num_speculative_blocks:
                num_tokens += self.block_size * self.num_speculative_blocks
            args = (num_tokens, hits, total_computed_tokens, num_tokens_main_model)
            return super().get_num_blocks_to_allocate(request_id, *args, apply_admission_cap)
        # Lookahead tokens get no state block (draft models have no Mamba layers).
        num_tokens = num_tokens_main_model
        table = self.req_to_blocks.get(request_id, ())
        num_new = cdiv(num_tokens, self.block_size) + self.num_speculative_blocks
        num_new -= len(hits) + len(table)
        partial = bool(hits and total_computed_tokens % self.block_size) or (
            request_id in self._partial_hits
        )
        if partial:
            num_new = max(num_new, 0) + 1  # the copy of a shared partial state
        checkpoint = None
        if self.has_checkpoint_blocks:
            checkpoint = self._checkpoint_for(
                request_id, total_computed_tokens, num_tokens, prefill_end, table
            )
            if not apply_admission_cap:
                if checkpoint:
                    self._checkpoints[request_id] = checkpoint
                else:
                    self._checkpoints.pop(request_id, None)
        if num_new > 0:
            # One block for the chunk's end state, one for a checkpoint, and the
            # speculative blocks the first allocation adds.
            cap = 1 + partial + (checkpoint is not None)
            if request_id not in self._allocated:
                cap += self.num_speculative_blocks
            num_new = min(num_new, cap)
        refs = [pool.ref_cnt[b] for b in hits if b]
        return num_new + refs.count(0)

    def _checkpoint_for(
        self,
        request_id: str,
        query_start: int,
        query_end: int,
        prefill_end: int,
        table: Sequence[int],
    ) -> tuple[int, int] | None:
        """The (position, table index) of the prefill checkpoint a chunk ``[query_start,
        query_end)`` reserves a block for, or None."""
        if query_end < prefill_end:
            return None
        position = prefill_checkpoint_position(
            query_end,
            self.alignment_tokens,
            self.drop_eagle_checkpoint_block,
            self.num_hash_lookahead_tokens,
        )
        index = cdiv(query_end, self.block_size) - 2
        if index < 0 or not prefill_checkpoint_exportable(
            query_start,
            query_end,
            position,
            self.hash_block_size,
            self.block_size,
            self.checkpoint_alignment,
        ):
            return None
        free_slot = (
            index >= len(table)
            or table[index] == NULL_BLOCK
            or (request_id in self._allocated and index >= len(table) - self.num_speculative_blocks)
        )
        return (position, index) if free_slot else None

    def allocate_new_blocks(
        self, request_id: str, num_tokens: int, num_tokens_main_model: int
    ) -> list[int]:
        if not self.align:
            if self.num_speculative_blocks:
                num_tokens += self.block_size * self.num_speculative_blocks
            return super().allocate_new_blocks(request_id, num_tokens, num_tokens_main_model)
        table = self.req_to_blocks[request_id]
        start = len(table)
        num_spec = self.num_speculative_blocks
        required = cdiv(num_tokens_main_model, self.block_size) + num_spec
        checkpoint = int(request_id in self._checkpoints)
        partial = self._partial_hits.get(request_id) if self._partial_hits else None
        pool = self.block_pool
        allocated = request_id in self._allocated
        if required <= start and not checkpoint and partial is None:
            if not allocated:
                self._mark_allocated(request_id)
            return []
        # (The coordinator's journal_tables undoes the table's growth.)
        pool.record(self._restore_last_state, request_id, self._last_state.get(request_id))
        if allocated:
            self._last_state[request_id] = start - 1 - num_spec  # the running state
        elif start > 0:
            self._last_state[request_id] = start - 1  # the hit's state
        num_skipped = required - num_spec - 1
        if start < num_skipped:
            table.extend([NULL_BLOCK] * (num_skipped - checkpoint - start))
        if allocated and num_spec:
            # Speculative blocks this step leaves behind move to the end (one stays at
            # the checkpoint index: the kernel exports the checkpoint into it).
            for index in range(start - num_spec, start):
                if index >= num_skipped - checkpoint:
                    break
                self._relocate_speculative_block(table, index)
        num_new = max(required - len(table), 0)
        if partial is None:
            table.extend(pool.get_new_blocks(num_new))
            if not allocated:
                self._mark_allocated(request_id)
            return table[start:]
        # A partial state to copy first (copy on write).
        new = pool.get_new_blocks(num_new + 1)
        returned = table[start:]
        copy, new = new[0], new[1:]  # (the pool's journal holds the list it returned)
        self._pop_partial(request_id)
        if allocated:
            self._preserve_partial_tail(request_id, *partial, copy)
        else:
            self._apply_copy(request_id, partial[0], partial[1], copy)
            returned.insert(0, copy)
        table.extend(new)
        if not allocated:
            self._mark_allocated(request_id)
        return returned + new

    def _relocate_speculative_block(self, table: list[int], index: int) -> None:
        """Move the speculative block at ``index`` to the end of ``table``, a null in its
        place (undone with the allocation). The block must be the request's alone and
        unhashed: a shared or cached block would carry another reader's state along."""
        block = table[index]
        pool = self.block_pool
        if block == NULL_BLOCK or pool.ref_cnt[block] != 1 or pool.block_hash[block] is not None:
            raise KVCacheRuntimeError(
                f"group {self.kv_cache_group_id}: speculative Mamba block {block} must be "
                "exclusively owned and unhashed before relocation"
            )
        pool.record(table.__setitem__, index, block)
        table.append(block)
        table[index] = NULL_BLOCK

    def _preserve_partial_tail(self, request_id: str, index: int, source: int, copy: int) -> None:
        """The request keeps writing ``source`` (its table only grows): the prefix cache's
        key moves to ``copy``, which the engine fills from ``source`` before this step."""
        pool = self.block_pool
        pool.move_block_keys(source, copy)
        self._queue_copy(source, copy)
        if self.offers is not None:
            self.offers.copy_producer_tail(pool, request_id, copy)
        pool.ref_cnt[source] += 1
        pool.record(pool.ref_cnt.__setitem__, source, pool.ref_cnt[source] - 1)
        h = pool.block_hash[copy]
        if h is not None and h not in self._cached_this_step:
            # Filled only by this step's copy: a same-step hit on it must wait.
            self._cached_this_step.add(h)
            pool.record(self._cached_this_step.discard, h)

    def _mark_allocated(self, request_id: str) -> None:
        self._allocated.add(request_id)
        self.block_pool.record(self._allocated.discard, request_id)

    def remove_skipped_blocks(
        self,
        request_id: str,
        num_computed_tokens: int,
        peers: Sequence[Any] = (),
        num_prompt_tokens: int | None = None,
    ) -> None:
        """Null and free the states before the computed tokens' last one. "align" tables
        hold nulls between states, so the walk skips them and resumes where the
        previous one stopped; the block of the latest state goes once the computed
        tokens move past it.

        Args:
            request_id: the running request.
            num_computed_tokens: tokens computed so far.
            peers: more managers of this class and spec (read when not "align").
            num_prompt_tokens: unused.
        """
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
        table = self.req_to_blocks[request_id]
        added = {h for b in table[first:last] if b and (h := hashes[b]) is not None}
        if self.align:
            # Also a plain step ending on the prompt's boundary: vLLM keys that state
            # again if it has no key (``evict_blocks`` dropped it, or two or more
            # lookahead hash tokens moved the boundary off the replay boundary).
            tail = self._cache_tail_state(request, num_tokens)
            if tail is not None:
                added.add(tail)
        if self.offers is not None and self.align:
            self._offer_keyed(request_id, first, last)
        this_step = self._cached_this_step
        added -= this_step
        if added:
            this_step |= added
            self.block_pool.record(this_step.difference_update, added)  # on rollback

    def offer_boundary_states(self) -> None:
        """Record keyed align states for a KV connector (see ``BoundaryStateOffers``)."""
        if self.align and self.offers is None:
            self.offers = BoundaryStateOffers()

    def _offer_keyed(self, request_id: str, first: int, last: int) -> None:
        """Offer the states this step keyed in table positions ``[first, last)``, each at the
        boundary its key covers (a checkpoint re-keyed inside its block counts there)."""
        offers = self.offers
        assert offers is not None
        pool = self.block_pool
        table = self.req_to_blocks[request_id]
        for index in range(first, min(last, len(table))):
            block = table[index]
            if block and pool.block_hash[block] is not None:
                tokens = pool.sub_block_key_tokens(block) or (index + 1) * self.block_size
                offers.offer(pool, request_id, block, tokens)

    def finalize_partial_tail(
        self, request_id: str, num_computed_tokens: int, num_in_flight_tokens: int
    ) -> tuple[int, int] | None:
        """A finishing request's own partial tail ``(block, tokens)``, taken once, if its
        block still holds that state (nothing computed past it, nothing in flight)."""
        if self.offers is None:
            return None
        tail = self.offers.take_producer_tail(request_id)
        if tail is None or num_in_flight_tokens or num_computed_tokens != tail[1]:
            return None
        return tail

    def _cache_tail_state(self, request: Request, num_tokens: int) -> BlockHash | None:
        """Key the state a step leaves inside its last block: the reserved checkpoint,
        or the prompt's last hash boundary. Returns the hash keyed now, if any."""
        request_id = request.request_id
        checkpoint = self._checkpoints.get(request_id)
        if checkpoint is not None:
            return self._cache_checkpoint(request, *checkpoint)
        hash_block_size = self.hash_block_size
        if num_tokens <= 0 or num_tokens % hash_block_size:
            return None
        boundary = prefill_checkpoint_position(
            request.num_prompt_tokens,
            hash_block_size,
            self.drop_eagle_checkpoint_block,
            self.num_hash_lookahead_tokens,
        )
        if num_tokens != boundary:
            return None
        table = self.req_to_blocks[request_id]
        index = cdiv(num_tokens, self.block_size) - 1
        if index >= len(table) or table[index] == NULL_BLOCK:
            return None
        source = table[index]
        pool = self.block_pool
        if self._keyed_at(request, source, num_tokens):
            return None  # keyed by a hit or an earlier step: re-keying would defer siblings
        h = pool.cache_partial_block(
            request, source, num_tokens, self.kv_cache_group_id, self.block_size
        )
        if num_tokens % self.block_size:
            # This request produced a partial tail: its next step keeps writing the
            # block, so that step moves the key to a copy (copy on write).
            self._set_partial(request_id, index, source)
            if self.offers is not None:
                self.offers.note_producer_tail(pool, request_id, source, num_tokens)
            self.num_cached_block[request_id] = index  # journal_tables undoes it
        return h

    def _cache_checkpoint(self, request: Request, position: int, index: int) -> BlockHash | None:
        block = self.req_to_blocks[request.request_id][index]
        prompt_checkpoint = position == prefill_checkpoint_position(
            request.num_prompt_tokens,
            self.alignment_tokens,
            self.drop_eagle_checkpoint_block,
            self.num_hash_lookahead_tokens,
        )
        retained = False
        if position % self.block_size == 0:
            block_index = position // self.block_size - 1
            kept = self.reachable_positions(
                self.block_size,
                block_index,
                block_index + 1,
                self.alignment_tokens,
                self.retention_interval,
            )
            retained = kept is None or block_index in kept
        pool = self.block_pool
        if not (prompt_checkpoint or retained or position == request.shared_prefix_boundary):
            # A transient state: the next chunk overwrites it, so it must not hit.
            pool.uncache_block(block)
            return None
        if self._keyed_at(request, block, position):
            return None
        group_id = self.kv_cache_group_id
        off_position = position != (index + 1) * self.block_size
        return pool.cache_partial_block(
            request, block, position, group_id, self.block_size, True, off_position
        )

    def _keyed_at(self, request: Request, block: int, num_tokens: int) -> bool:
        # Keyed by the hash of exactly ``num_tokens`` of the request's tokens (a full key
        # may sit at another position: a checkpoint exported into the block, then the
        # block's own full key once cached).
        pool = self.block_pool
        if not pool.keyed_at(block, num_tokens, self.block_size):
            return False
        return bool(
            pool.block_hash[block] == request.block_hashes[num_tokens // self.hash_block_size - 1]
        )

    def free(self, request_id: str, priority: int = 0) -> None:
        self._forget_states(request_id)
        super().free(request_id, priority)

    def pop_blocks_for_free(self, request_id: str) -> list[int]:
        self._forget_states(request_id)
        return super().pop_blocks_for_free(request_id)

    def _forget_states(self, request_id: str) -> None:
        self._last_state.pop(request_id, None)
        self._retired.pop(request_id, None)
        self._allocated.discard(request_id)
        self._checkpoints.pop(request_id, None)
        if self.offers is not None:
            self.offers.forget(request_id)

    def new_step_starts(self) -> None:
        self._cached_this_step.clear()

    def _restore_last_state(self, request_id: str, last_state: int | None) -> None:
        if last_state is None:
            self._last_state.pop(request_id, None)
        else:
            self._last_state[request_id] = last_state
