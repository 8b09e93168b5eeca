"""vLLM's ``vllm.v1.core.block_pool`` over pagedkv's ``BlockPool``: the same pool, with
vLLM's block objects, cache-key map view and free-queue view."""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator, MutableMapping, Sequence
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
    hash maps of one pool; built without a pool, a map of its own (keys to the blocks
    inserted under them, the first inserted answering lookups). With a pool, standalone
    blocks (``KVCacheBlock(i)`` built outside any pool, which vLLM's pool caches as
    given) go to that map of its own: they are not the pool's blocks."""

    def __init__(self, pool: BlockPool | None = None) -> None:
        self._owner = pool
        self._own: dict[BlockHashWithGroupId, dict[int, KVCacheBlock]] = {}

    @property
    def _pool(self) -> BlockPool:
        if self._owner is None:
            raise ValueError("this BlockHashToBlockMap has no BlockPool behind it")
        return self._owner

    def get_one_block(self, key: BlockHashWithGroupId) -> KVCacheBlock | None:
        own = self._own.get(key)
        if self._owner is None or own:
            return next(iter(own.values())) if own else None
        block_id = self._pool.impl.hash_map(get_group_id(key)).get(get_block_hash(key))
        return None if block_id is None else self._pool.blocks[block_id]

    def contain(self, key: BlockHashWithGroupId, block_id: int) -> bool:
        if self._owner is None:
            return block_id in self._own.get(key, ())
        pool = self._pool.impl
        return pool.key_of(block_id) == (get_block_hash(key), get_group_id(key))

    def insert(self, key: BlockHashWithGroupId, block: KVCacheBlock) -> None:
        """Cache ``block`` under ``key`` (pagedkv's pool keeps later duplicates aside)."""
        if self._owner is not None and not self._owner.has_key(key):
            # A key starts over once empty, however it emptied (pop, eviction, reuse).
            self._owner.multi_keys.discard(key)
        if self._owner is None or block.pool is None or block.is_null:
            self._own.setdefault(key, {})[block.block_id] = block
            self._note_multi(key)
            return
        pool = self._owner.impl
        group_id, block_hash = get_group_id(key), get_block_hash(key)
        pool.block_hash[block.block_id] = block_hash
        pool.block_group[block.block_id] = group_id
        cached = pool.hash_map(group_id)
        if block_hash in cached:
            pool._dups[group_id].setdefault(block_hash, []).append(block.block_id)
        else:
            cached[block_hash] = block.block_id
        self._note_multi(key)

    def _note_multi(self, key: BlockHashWithGroupId) -> None:
        # vLLM's map turns a key's entry into a {block_id: block} dict at its second
        # block and keeps it a dict until the key empties; ``_cache`` shows the same.
        if self._owner is None:
            return
        if isinstance(_CacheView(self._owner).get(key), dict):
            self._owner.multi_keys.add(key)

    def pop(self, key: BlockHashWithGroupId, block_id: int) -> KVCacheBlock | None:
        if self._owner is None or block_id in self._own.get(key, ()):
            blocks = self._own.get(key, {})
            block = blocks.pop(block_id, None)
            if not blocks:
                self._own.pop(key, None)
            return block
        if not self.contain(key, block_id):
            return None
        self._owner.impl.evict_blocks([block_id])
        self._owner.impl.num_evictions -= 1
        return self._owner.blocks[block_id]

    @property
    def _cache(self) -> MutableMapping[BlockHashWithGroupId, Any]:
        """Every key with its block (or ``{block_id: block}`` for duplicates); with a
        pool, a live view: removing a key unmaps it (the block keeps its hash, as in
        vLLM), setting one maps it again."""
        if self._owner is None:
            return {
                k: next(iter(v.values())) if len(v) == 1 else dict(v) for k, v in self._own.items()
            }
        return _CacheView(self._pool)

    def __len__(self) -> int:
        if self._owner is None:
            return len(self._own)
        return len(_CacheView(self._owner))


class _CacheView(MutableMapping[BlockHashWithGroupId, Any]):
    """A pool's hash maps as vLLM's ``{key: block | {block_id: block}}`` dict."""

    def __init__(self, pool: BlockPool) -> None:
        self._pool = pool

    def __getitem__(self, key: BlockHashWithGroupId) -> Any:
        impl, blocks = self._pool.impl, self._pool.blocks
        group_id, block_hash = get_group_id(key), get_block_hash(key)
        held: dict[int, KVCacheBlock] = dict(
            self._pool.cached_block_hash_to_block._own.get(key, {})
        )
        if group_id < len(impl._maps) and block_hash in impl._maps[group_id]:
            first = impl._maps[group_id][block_hash]
            for b in (first, *impl._dups[group_id].get(block_hash, ())):
                held[b] = blocks[b]
        if not held:
            raise KeyError(key)
        if len(held) == 1 and key not in self._pool.multi_keys:
            return next(iter(held.values()))
        return held

    def __setitem__(self, key: BlockHashWithGroupId, value: Any) -> None:
        if not self._pool.has_key(key):
            self._pool.multi_keys.discard(key)
        impl = self._pool.impl
        group_id, block_hash = get_group_id(key), get_block_hash(key)
        ids = [value.block_id] if isinstance(value, KVCacheBlock) else list(value)
        impl.hash_map(group_id)[block_hash] = ids[0]
        if ids[1:]:
            impl._dups[group_id][block_hash] = ids[1:]
        else:
            impl._dups[group_id].pop(block_hash, None)

    def __delitem__(self, key: BlockHashWithGroupId) -> None:
        impl = self._pool.impl
        group_id, block_hash = get_group_id(key), get_block_hash(key)
        if group_id >= len(impl._maps) or block_hash not in impl._maps[group_id]:
            raise KeyError(key)
        del impl._maps[group_id][block_hash]
        impl._dups[group_id].pop(block_hash, None)

    def __iter__(self) -> Iterator[BlockHashWithGroupId]:
        for group_id, cached in enumerate(self._pool.impl._maps):
            for block_hash in list(cached):
                yield make_block_hash_with_group_id(block_hash, group_id)
        impl = self._pool.impl
        for key in list(self._pool.cached_block_hash_to_block._own):
            group_id = get_group_id(key)
            if group_id >= len(impl._maps) or get_block_hash(key) not in impl._maps[group_id]:
                yield key

    def __len__(self) -> int:
        if self._pool.cached_block_hash_to_block._own:
            return sum(1 for _ in self)
        return sum(len(m) for m in self._pool.impl._maps)

    def __copy__(self) -> dict[BlockHashWithGroupId, Any]:
        return dict(self.items())  # a snapshot, as copying vLLM's dict gives


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
    def fake_free_list_head(self) -> _ListEnd:
        return self._ends[0]

    @property
    def fake_free_list_tail(self) -> _ListEnd:
        return self._ends[1]

    def neighbours(self, block_id: int) -> tuple[Any, Any]:
        """The free-queue entries before and after free block ``block_id`` (a list end
        past either end); (None, None) for a block not in the queue."""
        order = self._pool.impl.queue.order()
        try:
            i = order.index(block_id)
        except ValueError:
            return None, None
        blocks = self._pool.blocks
        before = blocks[order[i - 1]] if i else self._ends[0]
        after = blocks[order[i + 1]] if i + 1 < len(order) else self._ends[1]
        return before, after

    @functools.cached_property
    def _ends(self) -> tuple[_ListEnd, _ListEnd]:
        return _ListEnd(self, head=True), _ListEnd(self, head=False)


class _ListEnd:
    """A sentinel end of vLLM's doubly linked free list, over pagedkv's free queue order."""

    def __init__(self, queue: FreeBlockQueueView, head: bool) -> None:
        self._queue = queue
        self._head = head

    @property
    def next_free_block(self) -> Any:
        if not self._head:
            return None
        blocks = self._queue.get_all_free_blocks()
        return blocks[0] if blocks else self._queue.fake_free_list_tail

    @property
    def prev_free_block(self) -> Any:
        if self._head:
            return None
        blocks = self._queue.get_all_free_blocks()
        return blocks[-1] if blocks else self._queue.fake_free_list_head


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
        self.multi_keys: set[BlockHashWithGroupId] = set()  # see BlockHashToBlockMap
        # The runtime managers whose tables hold this pool's blocks (set by the manager).
        self.table_owners: Sequence[Any] = ()

    def has_key(self, key: BlockHashWithGroupId) -> bool:
        """Whether any block (the pool's or a standalone one) is cached under ``key``."""
        if self.cached_block_hash_to_block._own.get(key):
            return True
        group_id = get_group_id(key)
        maps = self.impl._maps
        return group_id < len(maps) and get_block_hash(key) in maps[group_id]

    def full_key_tokens(self, block_id: int) -> int | None:
        """Tokens a whole-block key covers: where the block ends in a table of its group
        (None when no request holds it)."""
        group_id = self.impl.block_group[block_id]
        for manager in self.table_owners:
            if manager.kv_cache_group_id != group_id:
                continue
            for table in manager.req_to_blocks.values():
                if block_id in table:
                    return (table.index(block_id) + 1) * int(manager.block_size)
        return None

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
        if found is not None:
            return self.ids_to_blocks(found)
        if not self.cached_block_hash_to_block._own:
            return None
        cached = self.cached_block_hash_to_block
        keys = [make_block_hash_with_group_id(block_hash, gid) for gid in kv_cache_group_ids]
        blocks = [cached.get_one_block(key) for key in keys]
        return None if None in blocks else blocks  # type: ignore[return-value]

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
        new_full = blocks[num_cached_blocks:num_full_blocks]
        if any(b.pool is None and not b.is_null for b in new_full):
            mixed = next((b for b in new_full if b.pool is not None), None)
            if mixed is not None:  # checked before any block is keyed
                raise ValueError(
                    f"cache_full_blocks: block {mixed.block_id} is this pool's while others "
                    "are standalone KVCacheBlocks; pass one kind"
                )
            self._cache_standalone_blocks(
                request,
                blocks,
                num_cached_blocks,
                num_full_blocks,
                block_size,
                kv_cache_group_id,
                keep,
            )
            return
        # The pool reads only the blocks it hashes (vLLM's callers may pass anything
        # before them).
        ids = [_pool.NULL_BLOCK] * num_cached_blocks
        ids += [b.block_id for b in blocks[num_cached_blocks:num_full_blocks]]
        self.impl.cache_full_blocks(
            request, ids, num_cached_blocks, num_full_blocks, block_size, kv_cache_group_id, keep
        )

    def _cache_standalone_blocks(
        self,
        request: Any,
        blocks: Sequence[KVCacheBlock],
        num_cached_blocks: int,
        num_full_blocks: int,
        block_size: int,
        group_id: int,
        keep: set[int] | None,
    ) -> None:
        """Key blocks built outside any pool by the request's (pagedkv-computed) block
        hashes, in this pool's map of standalone blocks; the pool's own blocks and events
        are untouched (vLLM's tests hash such blocks, a null block id among them)."""
        scale = block_size // (self.hash_block_size or block_size)
        for i in range(num_cached_blocks, num_full_blocks):
            block = blocks[i]
            if block.is_null or (keep is not None and i not in keep):
                continue
            key = make_block_hash_with_group_id(request.block_hashes[(i + 1) * scale - 1], group_id)
            old = block.block_hash
            if old == key:
                continue
            if old is not None:  # a shorter (partial) key gives way to the full one
                self.cached_block_hash_to_block.pop(old, block.block_id)
                block.reset_hash()
            block.set_block_hash(key)
            self.cached_block_hash_to_block.insert(key, block)

    def emit_cached_block_events(
        self,
        request: Any,
        num_cached_blocks: int,
        block_size: int,
        kv_cache_group_id: int,
    ) -> None:
        """A BlockStored event for the request's first blocks, reused from the cache."""
        self.impl.emit_cached_block_events(
            request, num_cached_blocks, block_size, kv_cache_group_id
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
        key = block.block_hash
        if key is None:
            return False
        if block.is_null:  # keyed on this side only (pagedkv never keys its null block)
            self.cached_block_hash_to_block.pop(key, block.block_id)
            block.reset_hash()
            return True
        self.impl.evict_blocks([block.block_id])
        return True

    def reset_prefix_cache(self) -> bool:
        if not self.impl.reset_prefix_cache():
            return False
        self.cached_block_hash_to_block._own.clear()  # standalone blocks keep their keys
        self.multi_keys.clear()
        self.null_block.reset_hash()
        if self.metrics_collector is not None:
            self.metrics_collector.reset()
        return True

    def get_num_free_blocks(self) -> int:
        return self.impl.num_free_blocks

    def get_usage(self) -> float:
        return self.impl.usage

    def take_events(self) -> list[KVCacheEvent]:
        return self.impl.take_events()
