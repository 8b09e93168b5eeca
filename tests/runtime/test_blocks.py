"""KVCacheBlocks and Request accessors."""

from __future__ import annotations

from pagedkv.runtime import BlockPool, KVCacheBlocks, Request


def test_kv_cache_blocks_concatenate_per_group_and_copy_ids() -> None:
    a = KVCacheBlocks(([1, 2], [3]))
    b = KVCacheBlocks(([4], []))
    total = a + b
    assert total.blocks == ([1, 2, 4], [3])
    ids = total.get_block_ids()
    ids[0].append(9)
    assert total.blocks[0] == [1, 2, 4]


def test_unhashed_block_ids_skip_nulls_and_cached_blocks() -> None:
    pool = BlockPool(8)
    pool.block_hash[2] = b"h"
    blocks = KVCacheBlocks(([0, 1, 2], [3]))
    assert blocks.get_unhashed_block_ids_all_groups(pool.block_hash) == [1, 3]


def test_request_token_views() -> None:
    req = Request("r", [1, 2, 3])
    req.append_output_token_ids([4, 5])
    req.append_output_token_ids(6)
    assert req.prompt_token_ids == [1, 2, 3]
    assert req.output_token_ids == [4, 5, 6]
    assert (req.num_tokens, req.num_output_tokens, req.num_prompt_tokens) == (6, 3, 3)
    assert "num_tokens=6" in repr(req)
