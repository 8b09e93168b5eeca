"""Builders and invariant checks shared by the runtime tests."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from pagedkv import (
    BlockPool,
    ChunkedLocalAttentionSpec,
    CrossAttentionManager,
    CrossAttentionSpec,
    EngineConfig,
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheManager,
    KVCacheSpec,
    MambaSpec,
    SlidingWindowSpec,
)


def full(block_size: int = 4) -> FullAttentionSpec:
    return FullAttentionSpec(block_size=block_size, num_kv_heads=1, head_size=8)


def swa(window: int = 8, block_size: int = 4) -> SlidingWindowSpec:
    return SlidingWindowSpec(
        block_size=block_size, num_kv_heads=1, head_size=8, sliding_window=window
    )


def chunked(chunk: int = 8, block_size: int = 4) -> ChunkedLocalAttentionSpec:
    return ChunkedLocalAttentionSpec(
        block_size=block_size, num_kv_heads=1, head_size=8, attention_chunk_size=chunk
    )


def mamba(block_size: int = 4, mode: str = "align") -> MambaSpec:
    return MambaSpec(
        block_size=block_size,
        shapes=((4, 4),),
        dtypes=("bfloat16",),
        mamba_cache_mode=mode,  # type: ignore[arg-type]
    )


def mamba2(block_size: int = 4, alignment: int = 1) -> MambaSpec:
    """A Mamba-2 / gated-DeltaNet-like state: align mode with one prefill checkpoint block."""
    return MambaSpec(
        block_size=block_size,
        shapes=((4, 4),),
        dtypes=("bfloat16",),
        mamba_cache_mode="align",
        num_prefill_checkpoint_blocks=1,
        prefill_checkpoint_alignment=alignment,
    )


def cross(block_size: int = 4) -> CrossAttentionSpec:
    return CrossAttentionSpec(block_size=block_size, num_kv_heads=1, head_size=8)


def kv_config(
    specs: Sequence[KVCacheSpec], num_blocks: int = 32, max_model_len: int = 256
) -> KVCacheConfig:
    groups = tuple(
        KVCacheGroupSpec(layer_names=(f"layer{i}",), kv_cache_spec=spec)
        for i, spec in enumerate(specs)
    )
    return KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=(),
        kv_cache_groups=groups,
        max_model_len=max_model_len,
    )


def make_manager(
    specs: Sequence[KVCacheSpec],
    num_blocks: int = 32,
    max_model_len: int = 256,
    **kwargs: object,
) -> KVCacheManager:
    config = EngineConfig.create(max_model_len=max_model_len, max_num_batched_tokens=64)
    return KVCacheManager(
        kv_config(specs, num_blocks, max_model_len),
        config,
        **kwargs,  # type: ignore[arg-type]
    )


def cached_blocks(pool: BlockPool) -> dict[tuple[Any, int], list[int]]:
    """Every ``(block hash, group id)`` key of the pool with its blocks, first-inserted first."""
    return {
        (h, gid): [block, *pool._dups[gid].get(h, ())]
        for gid, m in enumerate(pool._maps)
        for h, block in m.items()
    }


def check_invariants(
    manager: KVCacheManager,
    allocated_tokens: Mapping[str, int] | None = None,
    encoder_tokens: int = 0,
) -> None:
    """The pool and every table agree. ``allocated_tokens``: request id -> tokens it holds
    slots for (checked against each table's length; cross-attention tables against
    ``encoder_tokens``)."""
    pool = manager.block_pool
    free = pool.queue.order()
    assert len(free) == len(set(free)), "a block is twice in the free queue"
    assert 0 not in free, "the null block is in the free queue"
    holders: Counter[int] = Counter()
    group_of: dict[int, int] = {}
    for gid, m in enumerate(manager.managers):
        for table in m.req_to_blocks.values():
            for b in table:
                if b != 0:
                    holders[b] += 1
                    assert group_of.setdefault(b, gid) == gid, f"block {b} in two groups"
        for source, copy in m._cow_copies:  # a queued copy holds both its blocks
            holders[source] += 1
            holders[copy] += 1
    free_set = set(free)
    for block in range(1, pool.num_blocks):
        assert pool.ref_cnt[block] == holders[block], (
            f"block {block}: ref count {pool.ref_cnt[block]}, held by {holders[block]}"
        )
        assert (block in free_set) == (holders[block] == 0), f"block {block} free and held"
    used = sum(1 for b in range(1, pool.num_blocks) if pool.ref_cnt[b] > 0)
    assert len(free) + used + 1 == pool.num_blocks
    assert pool.num_free_blocks == len(free)
    cached = cached_blocks(pool)
    # Every (key, block) of the hash map is one of the block's keys, and the other way.
    in_map = sorted((b, key) for key, blocks in cached.items() for b in blocks)
    per_block = sorted((b, key) for b in range(pool.num_blocks) for key in pool._keys_of(b))
    assert in_map == per_block, "hash map and per-block keys disagree"
    for block, tokens in pool._key_tokens.items():
        assert pool.block_hash[block] is not None and tokens % manager.hash_block_size == 0
    if allocated_tokens is not None:
        for m in manager.managers:
            assert set(m.req_to_blocks) == set(allocated_tokens)
            for rid, num_tokens in allocated_tokens.items():
                if isinstance(m, CrossAttentionManager):
                    num_tokens = encoder_tokens
                expected = -(-num_tokens // m.block_size)
                assert len(m.req_to_blocks[rid]) == expected, (
                    f"{type(m).__name__}: request {rid} has {len(m.req_to_blocks[rid])} blocks "
                    f"for {num_tokens} tokens"
                )
