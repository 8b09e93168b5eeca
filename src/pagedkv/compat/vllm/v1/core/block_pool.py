"""vLLM's ``vllm.v1.core.block_pool`` over pagedkv's ``BlockPool``: the same pool, with
vLLM's block objects, cache-key map view and free-queue view."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from pagedkv.compat.vllm.v1.core.kv_cache_utils import (
    BlockHashWithGroupId,
    KVCacheBlock,
    get_block_hash,
    get_group_id,
    make_block_hash_with_group_id,
)
from pagedkv.errors import NoFreeBlocksError
from pagedkv.runtime import block_pool as _pool
from pagedkv.runtime.events import KVCacheEvent

__all__ = ["BlockHashToBlockMap", "BlockPool", "FreeBlockQueueView"]

MEDIUM_GPU = "GPU"


class BlockHashToBlockMap:
    """vLLM's ``cache key -> block`` map, read from (and written to) pagedkv's per-group
    hash maps of one pool."""

    def __init__(self, pool: BlockPool | None = None) -> None:
        self._owner = pool

    @property
    def _pool(self) -> BlockPool:
        if self._owner is None:
            raise ValueError("BlockHashToBlockMap is a view of a BlockPool's cache")
        return self._owner

    def get_one_block(self, key: BlockHashWithGroupId) -> KVCacheBlock | None:
        block_id = self._pool.impl.hash_map(get_group_id(key)).get(get_block_hash(key))
        return None if block_id is None else self._pool.blocks[block_id]

    def contain(self, key: BlockHashWithGroupId, block_id: int) -> bool:
        pool = self._pool.impl
        return pool.key_of(block_id) == (get_block_hash(key), get_group_id(key))

    def insert(self, key: BlockHashWithGroupId, block: KVCacheBlock) -> None:
        """Cache ``block`` under ``key`` (pagedkv's pool keeps later duplicates aside)."""
        pool = self._pool.impl
        group_id, block_hash = get_group_id(key), get_block_hash(key)
        pool.block_hash[block.block_id] = block_hash
        pool.block_group[block.block_id] = group_id
        cached = pool.hash_map(group_id)
        if block_hash in cached:
            pool._dups[group_id].setdefault(block_hash, []).append(block.block_id)
        else:
            cached[block_hash] = block.block_id

    def pop(self, key: BlockHashWithGroupId, block_id: int) -> KVCacheBlock | None:
        if not self.contain(key, block_id):
            return None
        self._pool.impl.evict_blocks([block_id])
        self._pool.impl.num_evictions -= 1
        return self._pool.blocks[block_id]

    @property
    def _cache(self) -> dict[BlockHashWithGroupId, Any]:
        """Every key with its block (or ``{block_id: block}`` for duplicates)."""
        from pagedkv.compat.vllm.v1.core.kv_cache_utils import make_block_hash_with_group_id

        pool, blocks = self._pool.impl, self._pool.blocks
        out: dict[BlockHashWithGroupId, Any] = _CacheSnapshot(pool)
        for group_id, cached in enumerate(pool._maps):
            for block_hash, block_id in cached.items():
                key = make_block_hash_with_group_id(block_hash, group_id)
                dups = pool._dups[group_id].get(block_hash)
                if dups:
                    out[key] = {b: blocks[b] for b in (block_id, *dups)}
                else:
                    out[key] = blocks[block_id]
        return out

    def __len__(self) -> int:
        return sum(len(m) for m in self._pool.impl._maps)


class _CacheSnapshot(dict[Any, Any]):
    """The key map as a dict; ``clear()`` also drops every key from the pool (vLLM's
    tests empty the prefix cache so)."""

    def __init__(self, pool: _pool.BlockPool) -> None:
        super().__init__()
        self._pool = pool

    def clear(self) -> None:
        pool = self._pool
        for block in range(pool.num_blocks):
            pool.uncache_block(block)
        super().clear()


class FreeBlockQueueView:
    """vLLM's ``free_block_queue`` as far as callers read it: pagedkv's free queue order."""

    def __init__(self, pool: BlockPool) -> None:
        self._pool = pool

    @property
    def num_free_blocks(self) -> int:
        return self._pool.impl.num_free_blocks

    def get_all_free_blocks(self) -> list[KVCacheBlock]:
        blocks = self._pool.blocks
        return [blocks[b] for b in self._pool.impl.queue.order()]

    def __iter__(self) -> Iterator[KVCacheBlock]:
        return iter(self.get_all_free_blocks())

    @property
    def fake_free_list_head(self) -> Any:
        return _ListEnd(self.get_all_free_blocks(), head=True)

    @property
    def fake_free_list_tail(self) -> Any:
        return _ListEnd(self.get_all_free_blocks(), head=False)


class _ListEnd:
    """The sentinel ends of vLLM's linked list, read as the first/last free block."""

    def __init__(self, blocks: list[KVCacheBlock], head: bool) -> None:
        self.next_free_block = blocks[0] if head and blocks else None
        self.prev_free_block = blocks[-1] if not head and blocks else None


class BlockPool:
    """vLLM's block pool: ``impl`` is the pagedkv pool doing the work; ``blocks[i]`` is a
    live view of block ``i``."""

    def __init__(
        self,
        num_gpu_blocks: int,
        enable_caching: bool,
        hash_block_size: int,
        enable_kv_cache_events: bool = False,
        metrics_collector: Any = None,
        num_hash_lookahead_tokens: int = 0,
        medium: str = MEDIUM_GPU,
        *,
        impl: _pool.BlockPool | None = None,
    ) -> None:
        if impl is None:
            impl = _pool.BlockPool(
                num_gpu_blocks, enable_caching, hash_block_size, enable_kv_cache_events
            )
            impl.medium = medium
        self.impl = impl
        self.num_gpu_blocks = impl.num_blocks
        self.enable_caching = impl.enable_caching
        self.hash_block_size = impl.hash_block_size
        self.num_hash_lookahead_tokens = num_hash_lookahead_tokens
        self.enable_kv_cache_events = impl._events is not None
        self.metrics_collector = metrics_collector
        self.blocks = [KVCacheBlock(i, pool=self) for i in range(impl.num_blocks)]
        self.null_block = self.blocks[_pool.NULL_BLOCK]
        self.null_block.is_null = True
        self.free_block_queue = FreeBlockQueueView(self)
        self.cached_block_hash_to_block = BlockHashToBlockMap(self)

    @property
    def medium(self) -> str:
        return self.impl.medium

    @property
    def kv_event_queue(self) -> list[KVCacheEvent]:
        events = self.impl._events
        return [] if events is None else events

    def ids_to_blocks(self, block_ids: Iterable[int]) -> list[KVCacheBlock]:
        blocks = self.blocks
        return [blocks[b] for b in block_ids]

    def get_cached_block(
        self, block_hash: Any, kv_cache_group_ids: Sequence[int]
    ) -> list[KVCacheBlock] | None:
        found = self.impl.get_cached_block(block_hash, list(kv_cache_group_ids))
        return None if found is None else self.ids_to_blocks(found)

    def cache_full_blocks(
        self,
        request: Any,
        blocks: Sequence[KVCacheBlock],
        num_cached_blocks: int,
        num_full_blocks: int,
        block_size: int,
        kv_cache_group_id: int,
        block_mask: Sequence[bool] | None = None,
    ) -> None:
        keep = None
        if block_mask is not None:
            keep = {num_cached_blocks + i for i, on in enumerate(block_mask) if on}
        ids = [b.block_id for b in blocks]
        self.impl.cache_full_blocks(
            request, ids, num_cached_blocks, num_full_blocks, block_size, kv_cache_group_id, keep
        )

    def cache_partial_block(
        self,
        request: Any,
        block: KVCacheBlock,
        num_tokens: int,
        kv_cache_group_id: int,
        block_size: int,
        replace_existing_hashes: bool = False,
    ) -> BlockHashWithGroupId | None:
        """Make ``block`` reachable from the hash boundary ``num_tokens`` (pagedkv's
        ``cache_partial_block``); None for the null block."""
        if block.is_null:
            return None
        unit = self.hash_block_size or block_size
        if block_size % unit or num_tokens <= 0 or num_tokens % unit:
            raise AssertionError(
                f"num_tokens {num_tokens} and block_size {block_size} must be positive "
                f"multiples of the hash block size {unit}"
            )
        if num_tokens > len(request.block_hashes) * unit:
            raise AssertionError(f"the request has no block hash at {num_tokens} tokens")
        block_hash = self.impl.cache_partial_block(
            request,
            block.block_id,
            num_tokens,
            kv_cache_group_id,
            block_size,
            replace_existing_hashes,
        )
        return make_block_hash_with_group_id(block_hash, kv_cache_group_id)

    @property
    def cached_block_hashes_by_block(self) -> dict[int, set[BlockHashWithGroupId]]:
        """Blocks with keys beyond their primary one: block id -> every key."""
        impl = self.impl
        out: dict[int, set[BlockHashWithGroupId]] = {}
        for block_id, extra in impl._extra_keys.items():
            if extra:
                keys = [impl.key_of(block_id), *extra]
                out[block_id] = {make_block_hash_with_group_id(*k) for k in keys if k}
        return out

    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
        try:
            ids = self.impl.get_new_blocks(num_blocks)
        except NoFreeBlocksError as exc:
            raise ValueError(f"Cannot get {num_blocks} free blocks from the pool") from exc
        blocks = self.ids_to_blocks(ids)
        collector = self.metrics_collector
        if collector is not None:
            for block in blocks:
                if self.enable_caching:
                    collector.on_block_evicted(block)
                collector.on_block_allocated(block)
        return blocks

    def touch(self, blocks: Sequence[KVCacheBlock]) -> None:
        self.impl.touch([b.block_id for b in blocks])
        collector = self.metrics_collector
        if collector is not None:
            for block in blocks:
                if not block.is_null:
                    collector.on_block_accessed(block)

    def is_block_writable(self, block: KVCacheBlock) -> bool:
        return not block.is_null and block.ref_cnt == 1 and block.block_hash is None

    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock]) -> None:
        self.impl.free_blocks([b.block_id for b in ordered_blocks if not b.is_null])

    def evict_blocks(self, block_ids: Iterable[int]) -> None:
        ids = list(block_ids)
        for block_id in ids:
            if not 0 <= block_id < self.num_gpu_blocks:
                raise AssertionError(f"Invalid block_id {block_id} >= {self.num_gpu_blocks}")
        self.impl.evict_blocks(ids)

    def _maybe_evict_cached_block(self, block: KVCacheBlock) -> bool:
        if block.block_hash is None:
            return False
        self.impl.evict_blocks([block.block_id])
        return True

    def reset_prefix_cache(self) -> bool:
        if not self.impl.reset_prefix_cache():
            return False
        if self.metrics_collector is not None:
            self.metrics_collector.reset()
        return True

    def get_num_free_blocks(self) -> int:
        return self.impl.num_free_blocks

    def get_usage(self) -> float:
        return self.impl.usage

    def take_events(self) -> list[KVCacheEvent]:
        return self.impl.take_events()
