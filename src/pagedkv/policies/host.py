"""The host tier: a second pool of KV cache blocks in host memory, indexed by block key.

Blocks evicted from the device pool are stored here (their key, and with tensors their
bytes in a pinned host buffer); a later lookup that misses on the device can load them
back. The interface follows vLLM's offloading manager: ``lookup`` counts the leading
keys present, ``prepare_load`` / ``complete_load`` pin and release blocks being copied to
the device, ``prepare_store`` / ``complete_store`` reserve and publish blocks being
written, and ``take_events`` reports what was stored or removed with medium ``CPU``.
Which stored block is dropped when the host pool is full is the tier's own eviction
policy (any registered name).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from pagedkv.errors import ConfigError, KVCacheRuntimeError
from pagedkv.policies.free_queue import PolicyFreeQueue, make_free_queue
from pagedkv.runtime.events import BlockRemoved, BlockStored, KVCacheEvent

__all__ = [
    "HOST_MEDIUM",
    "StorePlan",
    "HostTier",
]

HOST_MEDIUM = "CPU"


class StorePlan(NamedTuple):
    """What ``prepare_store`` reserved: the keys to write, the host block each goes to,
    and the keys evicted from the host to make room."""

    keys: list[Any]
    host_blocks: list[int]
    evicted_keys: list[Any]


class HostTier:
    """``num_blocks`` host blocks (ids ``1 .. num_blocks``, in a free queue of the chosen
    policy, like the device pool's); keys are the device pool's ``(block hash, group id)``
    pairs.

    Args:
        num_blocks: host blocks in the tier.
        policy: the eviction policy's name for the host free queue.
        block_size: tokens per block, for the tier's events.
        enable_events: record BlockStored/BlockRemoved events for the host medium.
    """

    def __init__(
        self,
        num_blocks: int,
        policy: str = "lru",
        *,
        block_size: int = 16,
        enable_events: bool = False,
    ) -> None:
        if not isinstance(num_blocks, int) or isinstance(num_blocks, bool) or num_blocks < 1:
            raise ConfigError(f"HostTier.num_blocks must be a positive integer, got {num_blocks!r}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.block_of: dict[Any, int] = {}
        self.key_of: list[Any] = [None] * (num_blocks + 1)
        self.pins = [0] * (num_blocks + 1)
        self.queue = make_free_queue(policy, num_blocks + 1)
        if isinstance(self.queue, PolicyFreeQueue):
            self.queue.key_of = self.key_of.__getitem__
        self._events: list[KVCacheEvent] | None = [] if enable_events else None
        self.num_stored = self.num_loaded = self.num_evicted = 0

    @property
    def num_cached_blocks(self) -> int:
        return len(self.block_of)

    def lookup(self, keys: Sequence[Any]) -> int:
        """How many of ``keys``, from the first, the host holds."""
        block_of = self.block_of
        for i, key in enumerate(keys):
            if key not in block_of:
                return i
        return len(keys)

    def prepare_load(self, keys: Sequence[Any]) -> list[int]:
        """Host blocks of ``keys`` (all present: see ``lookup``), pinned until
        ``complete_load``."""
        blocks = [self.block_of[key] for key in keys]
        for block in blocks:
            self._pin(block)
        return blocks

    def complete_load(self, keys: Sequence[Any]) -> None:
        """The copies to the device are done: release the pins; each load counts as a hit."""
        blocks = [self.block_of[key] for key in keys]
        if self.queue.wants_hits:
            for block in blocks:
                self.queue.hit(block)
        self._unpin(blocks)
        self.num_loaded += len(keys)

    def prepare_store(self, keys: Sequence[Any]) -> StorePlan:
        """Reserve host blocks for the keys not yet stored (best effort: fewer when every
        host block is pinned). Reserved blocks stay pinned until ``complete_store``."""
        block_of = self.block_of
        new = [key for key in dict.fromkeys(keys) if key not in block_of]
        count = min(len(new), len(self.queue))
        if not count:
            return StorePlan([], [], [])
        blocks = self.queue.pop(count)[0]
        evicted = []
        key_of, pins = self.key_of, self.pins
        for key, block in zip(new, blocks):
            old = key_of[block]
            if old is not None:  # a stored block makes room
                del block_of[old]
                evicted.append(old)
            key_of[block] = key
            block_of[key] = block
            pins[block] = 1
        self.num_evicted += len(evicted)
        self.num_stored += count
        if self._events is not None:
            for old in evicted:
                self._events.append(BlockRemoved([old[0]], HOST_MEDIUM, group_idx=old[1]))
        return StorePlan(new[:count], blocks, evicted)

    def complete_store(self, keys: Sequence[Any]) -> None:
        """The copies to the host are done: the blocks become loadable and evictable."""
        self._unpin([self.block_of[key] for key in keys])
        if self._events is not None:
            for h, gid in keys:
                self._events.append(
                    BlockStored(
                        [h], None, [], self.block_size, None, HOST_MEDIUM, None, group_idx=gid
                    )
                )

    def store(self, keys: Sequence[Any]) -> StorePlan:
        """``prepare_store`` and ``complete_store`` at once (no copy in flight)."""
        plan = self.prepare_store(keys)
        self.complete_store(plan.keys)
        return plan

    def take_events(self) -> list[KVCacheEvent]:
        events = self._events
        if not events:
            return []
        self._events = []
        return events

    # ---------------------------------------------------------------- internal
    def _pin(self, block: int) -> None:
        if self.pins[block] == 0:
            self.queue.remove(block)
        self.pins[block] += 1

    def _unpin(self, blocks: Sequence[int]) -> None:
        pins = self.pins
        released = []
        for block in blocks:
            if pins[block] <= 0:
                raise KVCacheRuntimeError(
                    f"host block {block} completed a load or store it never prepared"
                )
            pins[block] -= 1
            if pins[block] == 0:
                released.append(block)
        if released:
            self.queue.push_cached(released, 0)
