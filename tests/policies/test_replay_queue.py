"""A free queue that writes no undo (no ``unpop`` / ``reinsert``) is made undoable by
replay: the pool's stateful machine, with failures injected midway through allocations,
must find the pool and the queue exactly as they were."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import settings

from pagedkv import EngineConfig
from pagedkv.errors import ConfigError, KVCacheRuntimeError
from pagedkv.runtime import KVCacheManager
from pagedkv.runtime.free_queue import FreeQueue, LRUFreeQueue
from pagedkv.runtime.replay_queue import ReplayFreeQueue, undoable
from runtime.helpers import full, kv_config, swa
from runtime.test_stateful import MAX_MODEL_LEN

from .test_pool_policies import PolicyPoolMachine


class FifoQueue(FreeQueue):
    """Every freed block at the tail, cached or not; no undo of its own."""

    def __init__(self, num_blocks: int) -> None:
        self.blocks = list(range(1, num_blocks))

    def __len__(self) -> int:
        return len(self.blocks)

    def pop(self, num_blocks: int) -> tuple[list[int], Any]:
        taken = self.blocks[:num_blocks]
        del self.blocks[:num_blocks]
        return taken, None

    def push_uncached(self, blocks: Sequence[int], priority: int) -> None:
        self.blocks += blocks

    def push_cached(self, blocks: Sequence[int], priority: int, evict_first: bool = False) -> None:
        self.blocks += blocks

    def remove(self, block: int) -> Any:
        self.blocks.remove(block)

    def order(self) -> list[int]:
        return list(self.blocks)


class FifoPoolMachine(PolicyPoolMachine):
    def __init__(self) -> None:
        super().__init__()
        config = EngineConfig.create(max_model_len=MAX_MODEL_LEN, max_num_batched_tokens=64)
        self.manager = KVCacheManager(
            kv_config(self.specs(), self.num_blocks, MAX_MODEL_LEN),
            config,
            free_queue=FifoQueue(self.num_blocks),
        )


@pytest.mark.parametrize("layout", ["full", "hybrid"])
@pytest.mark.slow
def test_a_queue_without_undo_is_undone_by_replay(layout: str) -> None:
    specs = (lambda: [full()]) if layout == "full" else (lambda: [full(), swa(8)])
    machine = type("FifoMachine", (FifoPoolMachine,), {"specs": staticmethod(specs)})
    case = machine.TestCase
    case.settings = settings(max_examples=15, stateful_step_count=30, deadline=None)
    case().runTest()


def test_only_a_queue_without_undo_is_wrapped() -> None:
    fifo = FifoQueue(8)
    wrapped = undoable(fifo)
    assert isinstance(wrapped, ReplayFreeQueue) and wrapped.inner is fifo
    lru = LRUFreeQueue(8)
    assert undoable(lru) is lru
    config = EngineConfig.create(max_model_len=64)
    manager = KVCacheManager(kv_config([full()], 8, 64), config, free_queue=FifoQueue(8))
    assert isinstance(manager.block_pool.queue, ReplayFreeQueue)


def test_replay_rewinds_a_pop_and_a_removal() -> None:
    queue = undoable(FifoQueue(6))
    queue.pop(5)
    queue.push_cached([3, 1], 0)
    queue.push_uncached([4], 0)
    before = queue.order()
    removed = queue.remove(1)
    blocks, token = queue.pop(2)
    assert blocks == [3, 4] and queue.order() == []
    queue.unpop(blocks, token)
    queue.reinsert(1, removed)
    assert queue.order() == before == [3, 1, 4]
    with pytest.raises(KVCacheRuntimeError, match="folded"):
        for _ in range(2000):  # past the fold: the old position is gone
            queue.push_uncached(queue.pop(1)[0], 0)
        queue.reinsert(1, removed)


def test_a_queue_that_cannot_be_copied_is_refused_by_name() -> None:
    class Unpicklable(FifoQueue):
        def __init__(self, num_blocks: int) -> None:
            super().__init__(num_blocks)
            self.on_pop = lambda: None

    with pytest.raises(ConfigError, match="Unpicklable cannot be pickled"):
        undoable(Unpicklable(4))
