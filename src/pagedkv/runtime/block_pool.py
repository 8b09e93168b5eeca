"""The block pool: block ids, reference counts, the free queue and the prefix-cache hash map.

Block 0 is the null block. ``_maps[group][hash]`` is the block lookups return; further
blocks with the same key wait in ``_dups[group][hash]``. A block has one primary key
(``block_hash``/``block_group``); with partial prefix hits it may hold more keys
(``_extra_keys``) and a primary key at a hash boundary inside the block (``_key_tokens``:
the tokens it covers). Between ``begin`` and ``commit`` every change is journaled;
``rollback`` undoes them newest first. State kept beside the pool (a retention's, the free
queue's hit counts) changes once the transaction commits instead (``on_commit``), so it
needs no undo; the free queue undoes only its ``pop`` and ``remove``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar, cast

from pagedkv.errors import KVCacheRuntimeError, NoFreeBlocksError
from pagedkv.runtime.events import AllBlocksCleared, BlockRemoved, BlockStored, KVCacheEvent
from pagedkv.runtime.free_queue import FreeQueue, LRUFreeQueue
from pagedkv.runtime.hashing import BlockHash, event_extra_keys
from pagedkv.runtime.replay_queue import undoable

__all__ = [
    "NULL_BLOCK",
    "BlockPool",
]

_T = TypeVar("_T")

if TYPE_CHECKING:
    from pagedkv.runtime.request import Request

NULL_BLOCK = 0


class BlockPool:
    """Fixed set of KV cache blocks shared by every group of a model.

    Args:
        num_blocks: blocks in the pool, the null block (block 0) included.
        enable_caching: whether freed blocks that carry a hash stay findable (pushed as
            cached) until they are reused.
        hash_block_size: tokens per entry of ``request.block_hashes``; a group whose
            block size is a multiple of it keys each block by the hash of its last hash
            block. None: every group's block size is the hash block size.
        enable_events: record KV cache events (``take_events`` drains them).
        free_queue: the free-block order (eviction policy); None: vLLM's LRU queue. It
            must hold every block but the null block; one without ``unpop`` and
            ``reinsert`` is undone by replay (``ReplayFreeQueue``).
    """

    def __init__(
        self,
        num_blocks: int,
        enable_caching: bool = True,
        hash_block_size: int | None = None,
        enable_events: bool = False,
        free_queue: FreeQueue | None = None,
    ) -> None:
        if not isinstance(num_blocks, int) or isinstance(num_blocks, bool) or num_blocks < 1:
            raise KVCacheRuntimeError(
                f"BlockPool.num_blocks must be a positive integer, got {num_blocks!r}"
            )
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.hash_block_size = hash_block_size
        self.medium = "GPU"  # of the events
        self.num_hash_lookahead_tokens = 0  # tokens past each block its hash covers
        self.ref_cnt: list[int] = [0] * num_blocks
        self.block_hash: list[BlockHash | None] = [None] * num_blocks  # None: not cached
        self.block_group: list[int] = [0] * num_blocks
        self.queue = LRUFreeQueue(num_blocks) if free_queue is None else undoable(free_queue)
        if len(self.queue) != num_blocks - 1:
            raise KVCacheRuntimeError(
                f"BlockPool: the free queue holds {len(self.queue)} blocks, expected "
                f"{num_blocks - 1} (every block but the null block)"
            )
        self._queue_hits = self.queue.wants_hits
        self._maps: list[dict[BlockHash, int]] = []
        self._dups: list[dict[BlockHash, list[int]]] = []
        self._extra_keys: dict[int, list[tuple[BlockHash, int]]] = {}  # block -> (hash, group)
        self._key_tokens: dict[int, int] = {}  # block -> tokens of a sub-block primary key
        self._events: list[KVCacheEvent] | None = [] if enable_events else None
        self._journal: list[tuple[Any, ...]] | None = None
        self._on_commit: list[tuple[Callable[..., object], tuple[Any, ...]]] = []
        self.num_evictions = 0  # hashes dropped to reuse a block or by evict_blocks

    @property
    def num_free_blocks(self) -> int:
        return len(self.queue)

    def get_num_free_blocks(self) -> int:
        return len(self.queue)

    @property
    def usage(self) -> float:
        """Fraction of usable (non-null) blocks in use."""
        usable = self.num_blocks - 1
        return 0.0 if usable == 0 else 1.0 - len(self.queue) / usable

    def hash_map(self, group_id: int) -> dict[BlockHash, int]:
        """The ``block hash -> first cached block id`` map of one group."""
        while len(self._maps) <= group_id:
            self._maps.append({})
            self._dups.append({})
        return self._maps[group_id]

    def get_cached_block(self, block_hash: BlockHash, group_ids: Sequence[int]) -> list[int] | None:
        """One cached block per group id, or None if any group misses."""
        out = [self.hash_map(gid).get(block_hash) for gid in group_ids]
        return None if None in out else out  # type: ignore[return-value]

    def key_of(self, block: int) -> tuple[BlockHash, int] | None:
        """``(block hash, group id)`` of a cached block, None if it is not cached."""
        h = self.block_hash[block]
        return None if h is None else (h, self.block_group[block])

    def get_new_blocks(self, num_blocks: int) -> list[int]:
        """Pop blocks from the free queue's head (cached ones lose their hash)."""
        if num_blocks <= 0:
            return []
        queue = self.queue
        if num_blocks > len(queue):
            raise NoFreeBlocksError(
                f"cannot get {num_blocks} free blocks from the pool ({len(queue)} free)"
            )
        blocks, token = queue.pop(num_blocks)
        ref = self.ref_cnt
        hashes = self.block_hash
        undo: tuple[Callable[..., None], tuple[Any, ...]]
        m = self._plain_map()
        if m is not None:
            evicted_blocks: list[int] = []
            evicted_hashes: list[BlockHash] = []
            for block in blocks:
                ref[block] = 1
                h = hashes[block]
                if h is not None:
                    del m[h]
                    hashes[block] = None
                    evicted_blocks.append(block)
                    evicted_hashes.append(h)
            num_evicted = len(evicted_blocks)
            undo = (self._undo_pop_one_map, (blocks, evicted_blocks, evicted_hashes, token))
        else:
            plain = self._events is None and not self._key_tokens and not self._extra_keys
            evicted = self._evict_popped(blocks, plain)
            num_evicted = len(evicted)
            undo = (self._undo_pop, (blocks, evicted, token))
        self.num_evictions += num_evicted
        if self._journal is not None:
            self._journal.append(undo)
        return blocks

    def get_new_block(self) -> int:
        """``get_new_blocks(1)``'s block, for a caller outside a transaction (nothing is
        journaled): a decode step's one new block, cheaper."""
        m = self._plain_map()
        if m is None or self._journal is not None or not len(self.queue):
            return self._atomically(self.get_new_blocks, 1)[0]
        block = self.queue.pop_one()
        self.ref_cnt[block] = 1
        h = self.block_hash[block]
        if h is not None:
            del m[h]
            self.block_hash[block] = None
            self.num_evictions += 1
        return block

    def _plain_map(self) -> dict[BlockHash, int] | None:
        # The one hash map, when a keyed block is its key's only entry (no duplicate or
        # extra keys) and no event is recorded: evicting a block is one ``del``.
        maps = self._maps
        if len(maps) != 1 or self._dups[0] or self._events is not None:
            return None
        return None if self._key_tokens or self._extra_keys else maps[0]

    def _evict_popped(self, blocks: list[int], plain: bool) -> list[tuple[Any, ...]]:
        """Take one reference on each popped block and drop its keys (``plain``: no events
        and one key per block); returns what undoes each drop (``_drop_all_keys``)."""
        ref = self.ref_cnt
        hashes, groups, maps, dups = self.block_hash, self.block_group, self._maps, self._dups
        evicted: list[tuple[Any, ...]] = []
        for block in blocks:
            ref[block] = 1
            h = hashes[block]
            if h is not None:
                gid = groups[block]
                m = maps[gid]
                if plain and m.get(h) == block and h not in dups[gid]:  # _drop_key's common case
                    del m[h]
                    hashes[block] = None
                    evicted.append((block, h, gid))
                else:
                    evicted.append(self._drop_all_keys(block))
        return evicted

    def touch(self, blocks: Sequence[int]) -> None:
        """Take one more reference on each (non-null) block; free ones leave the queue."""
        ref = self.ref_cnt
        touched = [block for block in blocks if block]
        freed: list[int] = []
        for block in touched:
            if not ref[block]:  # a second mention sees 1: a block leaves the queue once
                freed.append(block)
            ref[block] += 1
        try:
            tokens = self.queue.remove_many(freed) if freed else []
        except BaseException:
            for block in touched:
                ref[block] -= 1
            raise
        if self._queue_hits:
            self.on_commit(self._report_hits, touched)
        if self._journal is not None:
            self._journal.append((self._undo_touch, (touched, freed, tokens)))

    def free_blocks(
        self, ordered_blocks: Iterable[int], priority: int = 0, evict_first: bool = False
    ) -> None:
        """Drop one reference on each block; those at zero are freed, the first given first."""
        ref = self.ref_cnt
        hashes = self.block_hash
        caching = self.enable_caching
        uncached: list[int] = []
        cached: list[int] = []
        for block in ordered_blocks:
            if block:
                count = ref[block] - 1
                ref[block] = count
                if count == 0:
                    if caching and hashes[block] is not None:
                        cached.append(block)
                    else:
                        uncached.append(block)
        if uncached:
            self.queue.push_uncached(uncached, priority)
        if cached:
            self.queue.push_cached(cached, priority, evict_first)

    def cache_full_blocks(
        self,
        request: Request,
        blocks: Sequence[int],
        num_cached_blocks: int,
        num_full_blocks: int,
        block_size: int,
        group_id: int,
        keep: set[int] | None = None,
    ) -> None:
        """Hash ``blocks[num_cached_blocks:num_full_blocks]`` (but nulls, indices not in keep).

        Args:
            request: the request whose ``block_hashes`` key the blocks.
            blocks: the group's block table for the request.
            num_cached_blocks: leading table positions already cached (skipped).
            num_full_blocks: table positions that are full; caching stops before it.
            block_size: the group's tokens per block.
            group_id: the KV cache group the keys belong to.
            keep: table positions to cache; None: every one in the range.
        """
        if num_cached_blocks >= num_full_blocks:
            return
        hashes = request.block_hashes
        scale = 1 if self.hash_block_size is None else block_size // self.hash_block_size
        if len(hashes) < num_full_blocks * scale:
            raise KVCacheRuntimeError(
                f"request {request.request_id!r} has {len(hashes)} block hashes; caching "
                f"{num_full_blocks} blocks of group {group_id} needs {num_full_blocks * scale}"
            )
        m = self.hash_map(group_id)
        dups = self._dups[group_id]
        block_hash, block_group = self.block_hash, self.block_group
        key_tokens = self._key_tokens
        # Position i is keyed by hash (i + 1) * scale - 1.
        new_hashes = hashes[(num_cached_blocks + 1) * scale - 1 : num_full_blocks * scale : scale]
        keyed: Iterable[tuple[int, BlockHash]] = zip(
            blocks[num_cached_blocks:num_full_blocks], new_hashes, strict=True
        )
        if keep is not None:
            keyed = (pair for i, pair in enumerate(keyed, num_cached_blocks) if i in keep)
        stored = []
        for block, h in keyed:
            if not block:
                continue
            old = block_hash[block]
            if old is not None:
                if old == h and block not in key_tokens:
                    continue  # keyed already
                # A key for fewer tokens (a partial prefix, or a checkpoint exported
                # into this block) gives way to the block's full key.
                self._journal_keys([block], self._keys_of(block))
                self._remove_keys(block)
            block_hash[block] = h
            block_group[block] = group_id
            if m.setdefault(h, block) != block:
                dups.setdefault(h, []).append(block)
            stored.append(block)
        if self._journal is not None:
            self._journal.append((self._undo_cache, (stored,)))
        if self._events is not None:
            now = set(stored)  # a block sits at one table position
            positions = [i for i in range(num_cached_blocks, num_full_blocks) if blocks[i] in now]
            parent = hashes[num_cached_blocks * scale - 1] if num_cached_blocks else None
            self._events.append(
                self._stored_event(
                    request,
                    cast("list[BlockHash]", [block_hash[b] for b in stored]),
                    parent,
                    positions,
                    (num_cached_blocks, num_full_blocks),
                    block_size,
                    group_id,
                )
            )

    def cache_full_block(
        self, request: Request, blocks: Sequence[int], index: int, block_size: int, group_id: int
    ) -> None:
        """``cache_full_blocks`` of table position ``index`` alone (a decode step's), done
        whole or not at all; cheaper for a block with no key yet, outside a transaction,
        with no events.

        Args:
            request: the request whose ``block_hashes`` key the block.
            blocks: the group's block table for the request.
            index: the table position to cache (full, not cached yet).
            block_size: the group's tokens per block.
            group_id: the KV cache group the key belongs to.
        """
        block = blocks[index]
        scale = 1 if self.hash_block_size is None else block_size // self.hash_block_size
        position = (index + 1) * scale - 1  # of the hash that keys the block
        hashes = request.block_hashes
        if (
            self._journal is None
            and self._events is None
            and position < len(hashes)
            and block
            and self.block_hash[block] is None
        ):
            h = hashes[position]
            self.block_hash[block] = h
            self.block_group[block] = group_id
            if self.hash_map(group_id).setdefault(h, block) != block:
                self._dups[group_id].setdefault(h, []).append(block)
            return
        self._atomically(
            self.cache_full_blocks, request, blocks, index, index + 1, block_size, group_id
        )

    def emit_cached_block_events(
        self, request: Request, num_blocks: int, block_size: int, group_id: int
    ) -> None:
        """A BlockStored event re-announcing the request's first ``num_blocks`` blocks, a
        prefix-cache hit (``kv_cache_report_mode="full"``); no block changes.

        Args:
            request: the request whose hit is announced.
            num_blocks: leading blocks of its table the hit covers.
            block_size: the group's tokens per block.
            group_id: the KV cache group the event names.
        """
        if self._events is None or num_blocks <= 0:
            return
        scale = 1 if self.hash_block_size is None else block_size // self.hash_block_size
        hashes = request.block_hashes[scale - 1 :: scale][:num_blocks]
        positions = list(range(num_blocks))
        event = self._stored_event(
            request, hashes, None, positions, (0, num_blocks), block_size, group_id
        )
        self._events.append(event)

    def _stored_event(
        self,
        request: Request,
        block_hashes: list[BlockHash],
        parent: BlockHash | None,
        positions: list[int],
        span: tuple[int, int],
        block_size: int,
        group_id: int,
    ) -> BlockStored:
        # ``positions``: table positions of ``block_hashes``; ``span``: the blocks whose
        # tokens the event carries (masked and null ones included, as vLLM sends them).
        lora = request.lora
        tokens = request.all_token_ids
        ahead = self.num_hash_lookahead_tokens
        extra_keys = [
            event_extra_keys(request, i * block_size, (i + 1) * block_size, ahead)
            for i in positions
        ]
        lookahead = None
        if ahead:
            lookahead = [
                tokens[(i + 1) * block_size : (i + 1) * block_size + ahead] for i in positions
            ]
        first, end = span[0] * block_size, span[1] * block_size
        return BlockStored(
            block_hashes=block_hashes,
            parent_block_hash=parent,
            token_ids=tokens[first:end],
            block_size=block_size,
            lora_id=None if lora is None else lora.id,
            medium=self.medium,
            lora_name=None if lora is None else lora.name,
            extra_keys=extra_keys or None,
            group_idx=group_id,
            session_id=request.session_id,
            lookahead_token_ids=lookahead,
        )

    def evict_blocks(self, block_ids: Iterable[int]) -> None:
        """Drop the hash of each block (in use or not); the blocks stay where they are."""
        for block in block_ids:
            if not isinstance(block, int) or not 0 <= block < self.num_blocks:
                raise KVCacheRuntimeError(
                    f"evict_blocks: block id {block!r} is outside the pool "
                    f"(0 .. {self.num_blocks - 1})"
                )
            if self.block_hash[block] is not None:
                self.num_evictions += 1
                self._drop_all_keys(block)

    def uncache_block(self, block: int) -> None:
        """Drop every key of the block (it stays where it is); not an eviction. Journaled."""
        if self.block_hash[block] is None:
            return
        undo = self._drop_all_keys(block)
        if self._journal is not None:
            self._journal.append(undo if callable(undo[0]) else (self._restore_key, undo))

    def has_key(self, block: int, block_hash: BlockHash, group_id: int) -> bool:
        """Whether ``(block_hash, group_id)`` is one of the block's keys."""
        key = (block_hash, group_id)
        return key in self._keys_of(block)

    def keyed_at(self, block: int, num_tokens: int, block_size: int) -> bool:
        """Whether the block's primary key covers exactly ``num_tokens`` tokens (a block's
        full key covers its whole block: ``num_tokens`` a multiple of ``block_size``)."""
        if self.block_hash[block] is None:
            return False
        tokens = self._key_tokens.get(block)
        return num_tokens % block_size == 0 if tokens is None else tokens == num_tokens

    def sub_block_key_tokens(self, block: int) -> int | None:
        """The tokens the block's primary key covers when it ends inside the block (a
        partial tail or checkpoint); None for a full-block key or no key."""
        return self._key_tokens.get(block)

    def cache_partial_block(
        self,
        request: Request,
        block: int,
        num_tokens: int,
        group_id: int,
        block_size: int,
        replace: bool = False,
        off_position: bool = False,
    ) -> BlockHash:
        """Key ``block`` by the hash of the request's first ``num_tokens`` tokens (a hash
        boundary, maybe inside the block) and return that hash: a primary key if the block
        has none, else one more key. A primary key covering fewer tokens, or with
        ``replace`` every key, is dropped first. ``off_position``: the block does not end
        at ``num_tokens`` even when it is a block multiple (a checkpoint exported into a
        later block), so the key records its tokens. Journaled.

        Args:
            request: the request whose ``block_hashes`` give the key.
            block: the block id to key.
            num_tokens: tokens of the request the key covers (a multiple of the hash
                block size).
            group_id: the KV cache group the key belongs to.
            block_size: the group's tokens per block.
            replace: drop every key the block has before keying it.
            off_position: the block does not end at ``num_tokens`` tokens.
        """
        hash_block_size = self.hash_block_size or block_size
        num_hashes = num_tokens // hash_block_size
        h = request.block_hashes[num_hashes - 1]
        key = (h, group_id)
        self._journal_keys([block], [key, *self._keys_of(block)])
        primary = self.block_hash[block]
        known = (primary, self.block_group[block]) == key or key in self._extra_keys.get(block, ())
        if replace or (not known and primary is not None and self._tokens_of(block) < num_tokens):
            self._remove_keys(block)
            known = False
        if not known:
            exact = off_position or num_tokens % block_size
            self._add_key(block, h, group_id, num_tokens if exact else None)
            if self._events is not None:
                self._events.append(self._tail_event(request, num_hashes, group_id))
        return h

    def move_block_keys(self, source: int, destination: int) -> None:
        """Move every key of ``source`` to the unkeyed ``destination`` (a private copy of
        its contents); no events. Journaled."""
        keys = self._keys_of(source)
        if not keys:
            return
        self._journal_keys([source, destination], keys)
        tokens = self._key_tokens.get(source)
        self._remove_keys(source, emit=False)
        for i, (h, gid) in enumerate(keys):
            self._add_key(destination, h, gid, tokens if i == 0 else None)

    def _tokens_of(self, block: int) -> int:
        tokens = self._key_tokens.get(block)
        return (1 << 62) if tokens is None else tokens  # a full-block key: the whole block

    def _keys_of(self, block: int) -> list[tuple[BlockHash, int]]:
        h = self.block_hash[block]
        if h is None:
            return []
        return [(h, self.block_group[block]), *self._extra_keys.get(block, ())]

    def _add_key(self, block: int, h: BlockHash, group_id: int, tokens: int | None) -> None:
        # tokens: a sub-block primary key's (None: whole block).
        m = self.hash_map(group_id)
        if self.block_hash[block] is None:
            self.block_hash[block] = h
            self.block_group[block] = group_id
            if tokens is not None:
                self._key_tokens[block] = tokens
        else:
            self._extra_keys.setdefault(block, []).append((h, group_id))
        if h in m:
            self._dups[group_id].setdefault(h, []).append(block)
        else:
            m[h] = block

    def _unmap(self, block: int, h: BlockHash, group_id: int) -> bool:
        m, dups = self._maps[group_id], self._dups[group_id]
        others = dups.get(h)
        if m.get(h) == block:
            if others:
                m[h] = others.pop(0)
            else:
                del m[h]
        elif others is not None and block in others:
            others.remove(block)
        else:
            return False
        if others == []:
            del dups[h]
        return True

    def _remove_keys(self, block: int, emit: bool = True) -> None:
        """Drop every key of the block (vLLM's order: primary first, then the others)."""
        removed = [key for key in self._keys_of(block) if self._unmap(block, *key)]
        self.block_hash[block] = None
        self._extra_keys.pop(block, None)
        self._key_tokens.pop(block, None)
        if emit and self._events is not None:
            for h, gid in removed:
                self._events.append(
                    BlockRemoved(block_hashes=[h], medium=self.medium, group_idx=gid)
                )

    def _drop_all_keys(self, block: int) -> tuple[Any, ...]:
        """Drop every key of the block; returns what undoes it: ``(block, hash, group,
        index)`` for ``_restore_key``, or ``(undo, args)``."""
        if block not in self._extra_keys and block not in self._key_tokens:
            return (block, *self._drop_key(block))
        snapshot = self._snapshot([block], self._keys_of(block))
        self._remove_keys(block)
        return (self._restore_snapshot, (snapshot,))

    def _journal_keys(self, blocks: list[int], keys: list[tuple[Any, int]]) -> None:
        if self._journal is not None:
            self._journal.append((self._restore_snapshot, (self._snapshot(blocks, keys),)))

    def _snapshot(self, blocks: list[int], keys: list[tuple[Any, int]]) -> tuple[Any, ...]:
        maps = []
        for h, gid in keys:
            m = self.hash_map(gid)
            maps.append((h, gid, m.get(h), list(self._dups[gid].get(h, ()))))
        states = [
            (
                b,
                self.block_hash[b],
                self.block_group[b],
                list(self._extra_keys.get(b, ())),
                self._key_tokens.get(b),
            )
            for b in blocks
        ]
        return maps, states

    def _restore_snapshot(self, snapshot: tuple[Any, ...]) -> None:
        maps, states = snapshot
        for h, gid, first, dups in maps:
            if first is None:
                self._maps[gid].pop(h, None)
            else:
                self._maps[gid][h] = first
            if dups:
                self._dups[gid][h] = list(dups)
            else:
                self._dups[gid].pop(h, None)
        for block, h, gid, extras, tokens in states:
            self.block_hash[block] = h
            self.block_group[block] = gid
            if extras:
                self._extra_keys[block] = list(extras)
            else:
                self._extra_keys.pop(block, None)
            if tokens is None:
                self._key_tokens.pop(block, None)
            else:
                self._key_tokens[block] = tokens

    def _tail_event(self, request: Request, num_hashes: int, group_id: int) -> BlockStored:
        # A key at a hash boundary: the event covers that hash block only (vLLM's).
        hash_block_size = self.hash_block_size or 1
        end = num_hashes * hash_block_size
        start = end - hash_block_size
        hashes = request.block_hashes
        ahead = self.num_hash_lookahead_tokens
        tokens = request.all_token_ids
        lora = request.lora
        return BlockStored(
            block_hashes=[hashes[num_hashes - 1]],
            parent_block_hash=hashes[num_hashes - 2] if num_hashes > 1 else None,
            token_ids=tokens[start:end],
            block_size=hash_block_size,
            lora_id=None if lora is None else lora.id,
            medium=self.medium,
            lora_name=None if lora is None else lora.name,
            extra_keys=[event_extra_keys(request, start, end, ahead)],
            group_idx=group_id,
            session_id=request.session_id,
            lookahead_token_ids=[tokens[end : end + ahead]] if ahead else None,
        )

    def reset_prefix_cache(self) -> bool:
        """Forget every cached hash; refused (False) while any block is in use."""
        if len(self.queue) != self.num_blocks - 1:
            return False
        self._maps, self._dups = [], []
        self._extra_keys, self._key_tokens = {}, {}
        self.block_hash[:] = [None] * self.num_blocks
        if self._events is not None:
            self._events.append(AllBlocksCleared())
        return True

    def _drop_key(self, block: int) -> tuple[BlockHash, int, int]:
        # Only a keyed block's key is dropped.
        h, gid = cast(BlockHash, self.block_hash[block]), self.block_group[block]
        self.block_hash[block] = None
        m, dups = self._maps[gid], self._dups[gid]
        others = dups.get(h)
        index = 0
        if m.get(h) == block:
            if others:
                m[h] = others.pop(0)
            else:
                del m[h]
        elif others is not None:
            index = others.index(block) + 1
            del others[index - 1]
        if others == []:
            del dups[h]
        if self._events is not None:
            self._events.append(BlockRemoved(block_hashes=[h], medium=self.medium, group_idx=gid))
        return h, gid, index

    def _restore_key(self, block: int, h: BlockHash, gid: int, index: int = 0) -> None:
        self.block_hash[block] = h
        self.block_group[block] = gid
        m = self.hash_map(gid)
        if h not in m:
            m[h] = block
        elif index == 0:
            self._dups[gid].setdefault(h, []).insert(0, m[h])
            m[h] = block
        else:
            self._dups[gid].setdefault(h, []).insert(index - 1, block)

    def take_events(self) -> list[KVCacheEvent]:
        """Events since the last call (empty when events are disabled)."""
        events = self._events
        if not events:
            return []
        self._events = []
        return events

    @property
    def in_transaction(self) -> bool:
        """Whether a transaction is open (between ``begin`` and ``commit``/``rollback``)."""
        return self._journal is not None

    def begin(self) -> int:
        """Start journaling changes; returns the savepoint ``rollback`` takes."""
        self._journal = []
        return len(self._events) if self._events is not None else 0

    def commit(self) -> None:
        self._journal = None
        if self._on_commit:
            changes, self._on_commit = self._on_commit, []
            for change, args in changes:
                change(*args)

    def on_commit(self, change: Callable[..., object], *args: Any) -> None:
        """Call ``change(*args)`` once the open transaction commits (a rollback drops it);
        at once outside a transaction. A plugin that changes its own state this way
        during an allocation never writes an undo."""
        if self._journal is None:
            change(*args)
        else:
            self._on_commit.append((change, args))

    def _atomically(self, change: Callable[..., _T], *args: Any) -> _T:
        # ``change(*args)``, undone if it raises (inside an open transaction: its part).
        if self._journal is not None:
            return change(*args)
        savepoint = self.begin()
        try:
            result = change(*args)
        except BaseException:
            self.rollback(savepoint)
            raise
        self.commit()
        return result

    def record(self, undo: Callable[..., object], *args: Any) -> None:
        """Inside a transaction: call ``undo(*args)`` on rollback."""
        if self._journal is not None:
            self._journal.append((undo, args))

    def rollback(self, savepoint: int) -> None:
        """Undo everything since ``begin``, newest first."""
        journal = self._journal or []
        self._journal = None
        self._on_commit = []
        for undo, args in reversed(journal):
            undo(*args)
        if self._events is not None:
            del self._events[savepoint:]

    def _undo_pop(self, blocks: list[int], evicted: list[tuple[Any, ...]], token: Any) -> None:
        for key in reversed(evicted):
            if callable(key[0]):
                key[0](*key[1])
            else:
                self._restore_key(*key)
        self._unpop(blocks, len(evicted), token)

    def _undo_pop_one_map(
        self,
        blocks: list[int],
        evicted_blocks: list[int],
        evicted_hashes: list[BlockHash],
        token: Any,
    ) -> None:
        m = self._maps[0]
        hashes = self.block_hash
        for block, h in zip(reversed(evicted_blocks), reversed(evicted_hashes)):
            hashes[block] = h
            m[h] = block
        self._unpop(blocks, len(evicted_blocks), token)

    def _unpop(self, blocks: list[int], num_evicted: int, token: Any) -> None:
        # The rest of a pop's undo, once the evicted keys are back.
        self.num_evictions -= num_evicted
        for block in blocks:
            self.ref_cnt[block] = 0
        self.queue.unpop(blocks, token)

    def _report_hits(self, blocks: list[int]) -> None:
        hit = self.queue.hit
        for block in blocks:
            hit(block)

    def _undo_touch(self, touched: list[int], freed: list[int], tokens: list[Any]) -> None:
        for block in reversed(touched):
            self.ref_cnt[block] -= 1
        for block, token in zip(reversed(freed), reversed(tokens)):
            self.queue.reinsert(block, token)

    def _undo_cache(self, stored: list[int]) -> None:
        for block in reversed(stored):
            self._drop_all_keys(block)
