"""Identical groups looked up together: every group must hit; checked against a direct
definition of the hit on random cache contents."""

from __future__ import annotations

from typing import Any

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

from pagedkv.runtime import BlockPool, FullAttentionManager, SlidingWindowManager
from pagedkv.runtime.managers.base import HitQuery

from .helpers import full, swa


def _pool(contents: list[set[int]], hashes: list[int]) -> BlockPool:
    """A pool whose group ``g`` caches ``hashes[i]`` for every ``i`` in ``contents[g]``."""
    pool = BlockPool(1 + len(contents) * len(hashes))
    block = 1
    for gid, positions in enumerate(contents):
        m = pool.hash_map(gid)
        for i in sorted(positions):
            m[hashes[i]] = block
            block += 1
    return pool


def _expected_blocks(pool: BlockPool, hashes: list[int], start: int, end: int) -> list[list[int]]:
    return [
        [0] * start + [pool.hash_map(g)[h] for h in hashes[start:end]]
        for g in range(len(pool._maps))
    ]


def _all_hit(contents: list[set[int]], i: int) -> bool:
    return all(i in positions for positions in contents)


@st.composite
def layouts(draw: Any) -> tuple[list[set[int]], int, int, int, int]:
    num_groups = draw(st.integers(1, 4))
    num_hashes = draw(st.integers(0, 16))
    base = draw(st.sets(st.integers(0, max(num_hashes - 1, 0)), max_size=num_hashes))
    base = {i for i in base if i < num_hashes}
    # Other groups mostly agree with the first (they are cached together), with holes.
    contents = [base] + [
        base - draw(st.sets(st.sampled_from(sorted(base)), max_size=2)) if base else set()
        for _ in range(num_groups - 1)
    ]
    block_size = draw(st.sampled_from([2, 4]))
    align_blocks = draw(st.sampled_from([1, 1, 2, 3]))
    max_length = draw(st.integers(0, num_hashes * block_size + 3))
    return contents, num_hashes, block_size, align_blocks, max_length


@settings(max_examples=300, deadline=None)
@given(layout=layouts(), window=st.integers(1, 12))
@pytest.mark.slow
def test_joint_sliding_window_hit_is_the_last_aligned_full_window(
    layout: tuple[list[set[int]], int, int, int, int], window: int
) -> None:
    contents, num_hashes, block_size, align_blocks, max_length = layout
    hashes = list(range(1000, 1000 + num_hashes))
    pool = _pool(contents, hashes)
    need = max(-(-(window - 1) // block_size), 1)
    limit = min(max_length // block_size, num_hashes)
    expected = None
    for end in range(limit, need - 1, -1):
        window_hit = all(_all_hit(contents, i) for i in range(end - need, end))
        if end % align_blocks == 0 and window_hit:
            expected = (_expected_blocks(pool, hashes, end - need, end), end * block_size)
            break
    if expected is None:  # no full window: the all-hit prefix from block 0
        prefix = 0
        while prefix < limit and _all_hit(contents, prefix):
            prefix += 1
        prefix -= prefix % align_blocks
        expected = (_expected_blocks(pool, hashes, 0, prefix), prefix * block_size)
    got = SlidingWindowManager.find_longest_cache_hit(
        HitQuery(
            hashes,
            max_length,
            tuple(range(len(contents))),
            pool,
            swa(window, block_size),
            align_blocks * block_size,
            block_size,
        )
    )
    assert got == expected


@settings(max_examples=200, deadline=None)
@given(layout=layouts())
@pytest.mark.slow
def test_joint_full_attention_hit_is_the_all_hit_prefix(
    layout: tuple[list[set[int]], int, int, int, int],
) -> None:
    contents, num_hashes, block_size, align_blocks, max_length = layout
    hashes = list(range(1000, 1000 + num_hashes))
    pool = _pool(contents, hashes)
    limit = min(max_length // block_size, num_hashes)
    prefix = 0
    while prefix < limit and _all_hit(contents, prefix):
        prefix += 1
    prefix -= prefix % align_blocks
    got = FullAttentionManager.find_longest_cache_hit(
        HitQuery(
            hashes,
            max_length,
            tuple(range(len(contents))),
            pool,
            full(block_size),
            align_blocks * block_size,
            block_size,
        )
    )
    assert got == (_expected_blocks(pool, hashes, 0, prefix), prefix * block_size)
