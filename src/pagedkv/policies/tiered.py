"""A KVCacheManager with a host tier below it, and ``make_kv_cache_manager`` to build
either by name.

``TieredKVCacheManager`` has the manager's API. Device evictions are stored on the host
as they happen (inside ``allocate_slots``); ``get_computed_blocks`` extends the device hit
with the blocks the host holds (a ``TieredHit``: tokens per tier); ``allocate_slots``
then gives the request fresh device blocks for the host part and queues their loads.
The engine takes the step's copies with ``take_transfers()`` (stores first: a loaded
block may be one just evicted) and runs them before the forward pass; transfers not
taken are considered done at the next ``new_step_starts()`` (the simulator's case).

Mapping to vLLM's offloading connector: ``get_computed_blocks``' host part is
``get_num_new_matched_tokens``, the load bookkeeping in ``allocate_slots`` is
``update_state_after_alloc``, ``take_transfers`` is the connector metadata handed to the
worker, and ``HostTier`` plays the ``OffloadingManager`` (lookup, prepare/complete
load and store, events with medium ``CPU``).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, Concatenate, NamedTuple, ParamSpec, TypeVar

from pagedkv.config import EngineConfig
from pagedkv.errors import ConfigError
from pagedkv.planning.types import KVCacheConfig
from pagedkv.policies.evictions import RecordingFreeQueue
from pagedkv.policies.free_queue import PolicyFreeQueue, make_free_queue
from pagedkv.policies.host import HostTier
from pagedkv.runtime.blocks import KVCacheBlocks
from pagedkv.runtime.events import KVCacheEvent
from pagedkv.runtime.kv_cache_manager import KVCacheManager
from pagedkv.runtime.managers.full import FullAttentionManager
from pagedkv.runtime.request import Request

__all__ = [
    "BlockPairs",
    "TieredHit",
    "Transfers",
    "TieredKVCacheManager",
    "make_kv_cache_manager",
]

BlockPairs = list[tuple[int, int]]
P = ParamSpec("P")
R = TypeVar("R")
S = TypeVar("S")


def _params_of(
    method: Callable[Concatenate[Any, P], Any],
) -> Callable[[Callable[Concatenate[S, ...], R]], Callable[Concatenate[S, P], R]]:
    """The decorated method takes ``method``'s parameters (declared once, there), for type
    checkers and for ``inspect.signature`` (help, introspecting callers); it names the
    leading ones it reads and forwards the rest."""

    def decorate(wrapper: Callable[Concatenate[S, ...], R]) -> Callable[Concatenate[S, P], R]:
        wrapper.__signature__ = inspect.signature(method)  # type: ignore[attr-defined]
        return wrapper

    return decorate


class TieredHit(NamedTuple):
    """A lookup's result: device blocks to adopt, and the hit length in tokens (device
    plus host), with each tier's share."""

    blocks: KVCacheBlocks
    num_computed_tokens: int
    num_device_tokens: int
    num_host_tokens: int


class Transfers(NamedTuple):
    """One step's copies, per group id: stores ``(device block, host block)``, loads
    ``(host block, device block)``."""

    stores: dict[int, BlockPairs]
    loads: dict[int, BlockPairs]


class TieredKVCacheManager:
    """``manager`` (its pool's free queue a ``RecordingFreeQueue``) plus ``host``."""

    def __init__(self, manager: KVCacheManager, host: HostTier, queue: RecordingFreeQueue) -> None:
        for gid, m in enumerate(manager.managers):
            if type(m) is not FullAttentionManager or m.block_size != manager.hash_block_size:
                raise ConfigError(
                    f"the host tier needs full-attention groups of one block size; group {gid} "
                    f"is {m.kv_cache_spec.kind!r} with block size {m.block_size}"
                )
        self.manager = manager
        self.host = host
        self.queue = queue
        self.block_size = manager.hash_block_size
        self.group_ids = range(len(manager.managers))
        self._pending: dict[str, tuple[int, int]] = {}  # request -> (first block, count)
        self._stores: list[tuple[int, list[Any], BlockPairs]] = []
        self._loads: list[tuple[int, list[Any], BlockPairs]] = []
        self.host_hit_tokens = 0  # tokens of the host hits allocated (loads queued)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.manager, name)

    # ----------------------------------------------------------------- lookup
    def get_computed_blocks(self, request: Request) -> TieredHit:
        blocks, num_device = self.manager.get_computed_blocks(request)
        bs = self.block_size
        first = num_device // bs
        hashes = request.block_hashes
        end = max(min((request.num_tokens - 1) // bs, len(hashes)), first)
        stored = self.host.block_of
        count = 0
        for gid in self.group_ids:  # each group must hold every block; stop at a miss
            i = first
            while i < end and (hashes[i], gid) in stored:
                i += 1
            end = i
            count = end - first
        if count:
            self._pending[request.request_id] = (first, count)
        else:
            self._pending.pop(request.request_id, None)
        return TieredHit(blocks, num_device + count * bs, num_device, count * bs)

    # ------------------------------------------------------------- allocation
    @_params_of(KVCacheManager.allocate_slots)
    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        *args: Any,
        **kwargs: Any,
    ) -> KVCacheBlocks | None:
        """As ``KVCacheManager.allocate_slots``; a new request's host hit (from its latest
        lookup, included in ``num_new_computed_tokens``) gets device blocks to load into."""
        pending = self._pending.pop(request.request_id, None)
        num_host = 0
        keys: dict[int, list[Any]] = {}
        if pending is not None and num_new_computed_tokens == sum(pending) * self.block_size:
            first, count = pending
            keys = self._keys(request, first, count)
            if any(self.host.lookup(k) < count for k in keys.values()):
                return None  # the host lost part of the hit since the lookup
            num_host = count * self.block_size
        blocks = self.manager.allocate_slots(
            request, num_new_tokens + num_host, num_new_computed_tokens - num_host, *args, **kwargs
        )
        if blocks is not None and pending is not None and num_host:
            self._queue_loads(request, pending, keys)
        self._store_evicted()
        return blocks

    def _keys(self, request: Request, first: int, count: int) -> dict[int, list[Any]]:
        hashes = request.block_hashes[first : first + count]
        return {gid: [(h, gid) for h in hashes] for gid in self.group_ids}

    def _queue_loads(
        self, request: Request, pending: tuple[int, int], keys: dict[int, list[Any]]
    ) -> None:
        first, count = pending
        for gid, group_keys in keys.items():
            table = self.manager.managers[gid].req_to_blocks[request.request_id]
            host_blocks = self.host.prepare_load(group_keys)
            pairs = list(zip(host_blocks, table[first : first + count], strict=True))
            self._loads.append((gid, group_keys, pairs))
        self.host_hit_tokens += count * self.block_size

    def _store_evicted(self) -> None:
        if not self.queue.evicted:
            return
        evicted = self.queue.take_evicted()
        by_group: dict[int, list[tuple[int, Any]]] = {}
        for block, key in evicted:
            by_group.setdefault(key[1], []).append((block, key))
        for gid, items in by_group.items():
            plan = self.host.prepare_store([key for _, key in items])
            target = dict(zip(plan.keys, plan.host_blocks, strict=True))
            pairs = [(block, target[key]) for block, key in items if key in target]
            self._stores.append((gid, plan.keys, pairs))

    def free(self, request: Request | str) -> None:
        """As ``KVCacheManager.free``; also drops a host hit looked up but never allocated
        (a request aborted while waiting)."""
        self._pending.pop(request if isinstance(request, str) else request.request_id, None)
        self.manager.free(request)

    # ------------------------------------------------------------------- steps
    def take_transfers(self) -> Transfers:
        """This step's copies; the host side counts them done (run them before the
        forward pass, stores first)."""
        out = Transfers({}, {})
        for gid, _, pairs in self._stores:
            out.stores.setdefault(gid, []).extend(pairs)
        for gid, _, pairs in self._loads:
            out.loads.setdefault(gid, []).extend(pairs)
        self._complete()
        return out

    def _complete(self) -> None:
        for _, keys, _ in self._stores:
            self.host.complete_store(keys)
        for _, keys, _ in self._loads:
            self.host.complete_load(keys)
        self._stores.clear()
        self._loads.clear()

    def new_step_starts(self) -> None:
        self._complete()
        self.manager.new_step_starts()

    def take_events(self) -> list[KVCacheEvent]:
        """The device pool's events (medium ``GPU``) then the host's (``CPU``)."""
        return self.manager.take_events() + self.host.take_events()


def make_kv_cache_manager(
    kv_cache_config: KVCacheConfig,
    config: EngineConfig,
    *,
    policy: str | None = None,
    host_num_blocks: int = 0,
    host_policy: str = "lru",
    **kwargs: Any,
) -> KVCacheManager | TieredKVCacheManager:
    """A manager whose pool evicts by ``policy`` (default: ``config.cache.eviction_policy``),
    with a host tier of ``host_num_blocks`` blocks (evicting by ``host_policy``) if > 0.
    ``kwargs`` go to ``KVCacheManager``.

    Args:
        kv_cache_config: the planned KV cache config.
        config: the engine config.
        policy: the device pool's eviction policy (None: ``config.cache.eviction_policy``).
        host_num_blocks: host tier blocks (0: no host tier).
        host_policy: the host tier's eviction policy.
    """
    name = policy or config.cache.eviction_policy
    queue = make_free_queue(name, kv_cache_config.num_blocks)
    recorder = RecordingFreeQueue(queue) if host_num_blocks > 0 else None
    manager = KVCacheManager(kv_cache_config, config, free_queue=recorder or queue, **kwargs)
    key_of = manager.block_pool.key_of
    if isinstance(queue, PolicyFreeQueue):
        queue.key_of = key_of
    if recorder is None:
        return manager
    recorder.key_of = key_of
    recorder.defer = manager.block_pool.on_commit
    host = HostTier(
        host_num_blocks,
        host_policy,
        block_size=manager.hash_block_size,
        enable_events=bool(kwargs.get("enable_events")),
    )
    return TieredKVCacheManager(manager, host, recorder)
