"""Sliding window attention: only the last ``sliding_window`` tokens are attended, so
blocks entirely before the window are freed and replaced by the null block."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pagedkv.runtime.block_pool import NULL_BLOCK
from pagedkv.runtime.managers.base import HitQuery, SingleTypeKVCacheManager

__all__ = [
    "SlidingWindowManager",
]

if TYPE_CHECKING:
    from pagedkv.runtime.request import Request
    from pagedkv.specs.base import KVCacheSpec


def _window_blocks(spec: KVCacheSpec) -> int:
    window = int(spec.sliding_window)  # type: ignore[attr-defined]
    return max(-(-(window - 1) // spec.block_size), 1)  # cdiv inline: see _grow_table


class SlidingWindowManager(SingleTypeKVCacheManager):
    """A hit needs the ``cdiv(sliding_window - 1, block_size)`` contiguous cached blocks
    ending at the hit (or a shorter run starting at block 0); found right to left."""

    skips_tokens = True
    sparse_retention = True

    @classmethod
    def find_longest_cache_hit(cls, query: HitQuery) -> tuple[list[list[int]], int]:
        block_size = query.spec.block_size
        alignment_tokens = query.alignment_tokens
        drop = query.drop_eagle_block
        # EAGLE: one block more is matched, then dropped from the hit.
        need = _window_blocks(query.spec) + drop
        hashes = query.hashes()
        limit = min(query.max_length // block_size, len(hashes))
        maps = [query.block_pool.hash_map(g) for g in query.group_ids]
        first = maps[0]
        aligned = alignment_tokens == block_size
        end_shift = 0 if drop else 1  # the hit ends this many blocks after the run's last
        # Right to left over the first group; a candidate window is checked in all groups.
        run = 0
        i = limit - 1
        tables: list[list[int]] | None = None
        while i >= 0:
            if hashes[i] not in first:
                run = 0
            elif run or aligned or not ((i + end_shift) * block_size) % alignment_tokens:
                run += 1  # a hit must end on an alignment boundary
                if run >= need:
                    tables, miss = _blocks(maps, hashes[i : i + run], i, last=True)
                    if miss < 0:
                        break
                    tables = None
                    run = 0
                    i += miss  # continue left of the miss
            i -= 1
        if tables is None:
            # No full window found: a run that starts at block 0 still covers a prefix.
            tables, miss = _blocks(maps, hashes[:run], 0, last=False)
            num_blocks = run if miss < 0 else miss
            if not aligned:
                num_blocks -= num_blocks % _blocks_per_alignment(alignment_tokens, block_size)
            for table in tables:
                del table[num_blocks:]
        num_blocks = len(tables[0]) if tables else 0
        if drop and num_blocks:
            num_blocks -= 1
            if not aligned:
                num_blocks -= num_blocks % _blocks_per_alignment(alignment_tokens, block_size)
            for table in tables:
                del table[num_blocks:]
        return tables, num_blocks * block_size

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._retained_tokens: int = self.kv_cache_spec.num_retained_tokens  # type: ignore[attr-defined]
        self._window_blocks = _window_blocks(self.kv_cache_spec)  # a hit's run of blocks

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        skipped = num_computed_tokens - self._retained_tokens
        return skipped if skipped > 0 else 0

    def next_skip_tokens(self, num_computed_tokens: int) -> int:
        # The next block leaves the window once the skipped tokens reach its end.
        num_skipped_blocks = self.get_num_skipped_tokens(num_computed_tokens) // self.block_size
        return self._retained_tokens + (num_skipped_blocks + 1) * self.block_size

    def hit_block_range(self, num_tokens: int) -> tuple[int, int]:
        end = num_tokens // self.block_size
        return max(end - self._window_blocks, 0), end

    def eagle_hit_block_range(self, num_tokens: int) -> tuple[int, int]:
        # The run an EAGLE lookup matches ends one block past the hit.
        end = num_tokens // self.block_size
        return max(end - self._window_blocks, 0), end + 1

    def reachable_blocks(self, request: Request, start: int, end: int) -> set[int] | None:
        """``reachable_positions`` for this manager and the request's replay boundaries."""
        interval = self.retention_interval
        boundaries = () if interval is None else self.replay_boundaries(request)
        return self.reachable_positions(
            self.kv_cache_spec,
            start,
            end,
            self.alignment_tokens,
            self.use_eagle,
            interval,
            boundaries,
        )

    @classmethod
    def reachable_positions(
        cls,
        spec: KVCacheSpec,
        start: int,
        end: int,
        alignment_tokens: int,
        use_eagle: bool,
        retention_interval: int | None,
        boundaries: Sequence[int] = (),
        final_segment_end: int | None = None,
    ) -> set[int] | None:
        """Table positions in ``[start, end)`` a hit ending at an aligned boundary can use
        (None: every one). A hit needs the window's blocks before it: with interval ``n``
        the last window of every ``n``-token segment, the windows before ``boundaries``
        (token positions; all intervals but None) and, with None, every aligned boundary's
        window (every block once a window spans a segment). An EAGLE group also keeps the
        block past each window (the one its lookups match and drop). ``final_segment_end``
        (a block index) ends the request's last, shorter segment: without EAGLE its window
        is kept too.

        Args:
            spec: the group's sliding-window spec (block size and window).
            start: the first table position to consider.
            end: the table position to stop before.
            alignment_tokens: hits end on multiples of it.
            use_eagle: the group's hits drop the EAGLE block.
            retention_interval: vLLM's ``prefix_cache_retention_interval``, in tokens.
            boundaries: token positions a hit must be able to resume at.
            final_segment_end: the block index the last segment ends at (None: none).
        """
        block_size = spec.block_size
        if alignment_tokens % block_size:
            return None  # a sub-block alignment: only caching everything is exact
        keep: set[int] = set()
        shift = 1 if use_eagle else 0
        need = _window_blocks(spec) + shift
        if retention_interval != 0:
            segment = alignment_tokens if retention_interval is None else retention_interval
            per_segment = segment // block_size
            if need >= per_segment:
                return None
            tail = per_segment - need
            keep.update(
                i for i in range(start, end) if i >= shift and (i - shift) % per_segment >= tail
            )
            if final_segment_end is not None and not use_eagle:
                last_size = final_segment_end % per_segment
                if last_size:
                    first = max(final_segment_end - last_size, final_segment_end - need, start)
                    keep.update(range(first, min(end, final_segment_end)))
        if retention_interval is not None:
            for boundary in boundaries:
                if boundary >= 0:
                    hit_end = boundary // alignment_tokens * alignment_tokens // block_size
                    hit_end += shift
                    keep.update(range(max(hit_end - need, 0, start), min(hit_end, end)))
        return keep


def _blocks(
    maps: list[dict[Any, int]], window: list[Any], start: int, last: bool
) -> tuple[list[list[int]], int]:
    # Each group's table (``start`` nulls, then ``window``'s blocks) and -1, or the index
    # of a miss: with ``last`` the first missing group's last, else the first over all.
    tables: list[list[int]] = []
    found = -1
    nulls: list[int | None] = [NULL_BLOCK] * start
    for m in maps:
        got = list(map(m.get, window))
        if None in got:
            if last:
                return tables, len(got) - 1 - got[::-1].index(None)
            index = got.index(None)
            found = index if found < 0 or index < found else found
            del got[index:]
        tables.append(nulls + got)  # type: ignore[arg-type]  # no None left
    return tables, found


def _blocks_per_alignment(alignment_tokens: int, block_size: int) -> int:
    """The fewest blocks whose tokens end on an alignment boundary (1 when the alignment
    is finer than the block, as with hashes finer than a hybrid model's blocks)."""
    return alignment_tokens // math.gcd(alignment_tokens, block_size)
