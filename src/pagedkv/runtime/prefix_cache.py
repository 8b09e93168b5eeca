"""The prefix-cache index of the block pool: which cached block holds which hash.

A cached block is found through ``_maps[group_id][block_hash] -> block id``; further
blocks with the same key (duplicate content) wait in ``_dups[group_id][block_hash]`` and
are promoted when the first goes. ``block_hash`` / ``block_group`` give a block's key.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from pagedkv.errors import KVCacheRuntimeError
from pagedkv.runtime.events import BlockRemoved, BlockStored, KVCacheEvent

if TYPE_CHECKING:
    from pagedkv.runtime.request import Request

NULL_BLOCK = 0


class PrefixCacheIndex:
    """Hash-map half of ``BlockPool`` (a mixin: the pool owns the state)."""

    num_blocks: int
    hash_block_size: int | None
    medium: str
    block_hash: list[Any]
    block_group: list[int]
    _maps: list[dict[Any, int]]
    _dups: list[dict[Any, list[int]]]
    _events: list[KVCacheEvent] | None
    _journal: list[tuple[Any, ...]] | None
    num_evictions: int
    event_token_ids: bool

    def hash_map(self, group_id: int) -> dict[Any, int]:
        """The ``block hash -> first cached block id`` map of one group."""
        maps = self._maps
        while len(maps) <= group_id:
            maps.append({})
            self._dups.append({})
        return maps[group_id]

    def key_of(self, block: int) -> tuple[Any, int] | None:
        """``(block hash, group id)`` of a cached block, None if it is not cached."""
        h = self.block_hash[block]
        return None if h is None else (h, self.block_group[block])

    def get_cached_block(self, block_hash: Any, group_ids: Sequence[int]) -> list[int] | None:
        """One cached block per group id, or None if any group misses."""
        out = []
        for gid in group_ids:
            block = self.hash_map(gid).get(block_hash)
            if block is None:
                return None
            out.append(block)
        return out

    def cached_blocks(self) -> dict[tuple[Any, int], list[int]]:
        """Every ``(block hash, group id)`` key with its blocks, first-inserted first."""
        out: dict[tuple[Any, int], list[int]] = {}
        for gid, m in enumerate(self._maps):
            dups = self._dups[gid]
            for h, block in m.items():
                out[(h, gid)] = [block, *dups.get(h, ())]
        return out

    # ---------------------------------------------------------------- caching
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
        """Give ``blocks[num_cached_blocks:num_full_blocks]`` their hash, skipping null
        blocks and, if ``keep`` is given, every index not in it.

        Block ``i``'s hash is the request's chain hash at token ``(i + 1) * block_size``.
        """
        if num_cached_blocks >= num_full_blocks:
            return
        hashes = request.block_hashes
        scale = 1 if self.hash_block_size is None else block_size // self.hash_block_size
        m = self.hash_map(group_id)
        block_hash = self.block_hash
        groups = self.block_group
        stored = []
        for i in range(num_cached_blocks, num_full_blocks):
            block = blocks[i]
            if block == NULL_BLOCK or block_hash[block] is not None:
                continue
            if keep is not None and i not in keep:
                continue
            h = hashes[i] if scale == 1 else hashes[(i + 1) * scale - 1]
            block_hash[block] = h
            groups[block] = group_id
            if h in m:
                self._dups[group_id].setdefault(h, []).append(block)
            else:
                m[h] = block
            stored.append(block)
        if self._journal is not None:
            self._journal.append(("cache", stored))
        if self._events is not None:
            self._events.append(
                self._stored_event(
                    request, stored, num_cached_blocks, num_full_blocks, block_size, group_id
                )
            )

    def _stored_event(
        self,
        request: Request,
        stored: list[int],
        first: int,
        end: int,
        block_size: int,
        group_id: int,
    ) -> BlockStored:
        scale = 1 if self.hash_block_size is None else block_size // self.hash_block_size
        parent = request.block_hashes[first * scale - 1] if first > 0 else None
        return BlockStored(
            block_hashes=[self.block_hash[b] for b in stored],
            parent_block_hash=parent,
            token_ids=(
                request.all_token_ids[first * block_size : end * block_size]
                if self.event_token_ids
                else []
            ),
            block_size=block_size,
            lora_id=None if request.lora is None else request.lora.id,
            medium=self.medium,
            lora_name=request.lora_name,
            group_idx=group_id,
        )

    def _drop_key(self, block: int, h: Any, gid: int) -> int:
        """Remove ``block`` from its key; returns its index among the key's blocks
        (0: the one lookups return), for ``_restore_key``."""
        self.block_hash[block] = None
        m = self._maps[gid]
        dups = self._dups[gid]
        others = dups.get(h)
        index = 0
        if m.get(h) == block:
            if others:
                m[h] = others.pop(0)
                if not others:
                    del dups[h]
            else:
                del m[h]
        elif others is not None:
            index = others.index(block) + 1
            del others[index - 1]
            if not others:
                del dups[h]
        if self._events is not None:
            self._events.append(BlockRemoved(block_hashes=[h], medium=self.medium, group_idx=gid))
        return index

    def _restore_key(self, block: int, h: Any, gid: int, index: int) -> None:
        """Undo of ``_drop_key``: ``block`` back at ``index`` among the key's blocks."""
        self.block_hash[block] = h
        self.block_group[block] = gid
        m = self.hash_map(gid)
        if h not in m:
            m[h] = block
            return
        dups = self._dups[gid].setdefault(h, [])
        if index == 0:
            dups.insert(0, m[h])
            m[h] = block
        else:
            dups.insert(index - 1, block)

    def evict_blocks(self, block_ids: Iterable[int]) -> None:
        """Drop the hash of each block (in use or not); the blocks stay where they are."""
        hashes = self.block_hash
        for block in block_ids:
            if not isinstance(block, int) or not 0 <= block < self.num_blocks:
                raise KVCacheRuntimeError(
                    f"evict_blocks: block id {block!r} is outside the pool "
                    f"(0 .. {self.num_blocks - 1})"
                )
            h = hashes[block]
            if h is not None:
                self.num_evictions += 1
                self._drop_key(block, h, self.block_group[block])
