"""Every eviction policy picks the victims its definition says, victim by victim.

A replay (synthetic trace, a cache small enough to evict, a sliding-window model under
dense retention so that blocks are also freed with ``evict_first``) records what the pool
asks of its free queue: frees (cached or not, with keys and priority), cache hits,
revivals and pops, with rolled-back calls taken out. The net sequence is then replayed
through a fresh queue of the policy and through a small reference written here from the
policy's definition (vLLM's LRU, LFU with dynamic aging, TensorRT-LLM-style priorities,
S3-FIFO as Yang et al., SOSP'23, and its authors' simulator define it); both must hand out
the same blocks at every pop, and the same as the live run did.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from pagedkv.policies.free_queue import PolicyFreeQueue, make_free_queue
from pagedkv.runtime import KVCacheManager, Request
from pagedkv.runtime.free_queue import FreeQueue
from pagedkv.sim.scheduling.scheduler import SchedulerSettings
from pagedkv.sim.scheduling.simulator import Simulator
from pagedkv.sim.traces.synthetic import SyntheticTraceConfig, synthetic_trace
from sim.helpers import make_setup

Op = tuple[Any, ...]


class OpRecorder(FreeQueue):
    """Forwards to ``inner`` and keeps the net list of calls (undos remove their call)."""

    def __init__(self, inner: FreeQueue) -> None:
        self.inner = inner
        self.wants_hits = True
        self.key_of: Callable[[int], Any] = lambda block: None
        self.ops: list[Op] = []

    def __len__(self) -> int:
        return len(self.inner)

    def pop(self, num_blocks: int) -> tuple[list[int], Any]:
        blocks, token = self.inner.pop(num_blocks)
        self.ops.append(("pop", num_blocks, tuple(blocks)))
        return blocks, token

    def unpop(self, blocks: list[int], token: Any) -> None:
        assert self.ops.pop() == ("pop", len(blocks), tuple(blocks))
        self.inner.unpop(blocks, token)

    def push_uncached(self, blocks: Sequence[int], priority: int) -> None:
        self.ops.append(("uncached", tuple(blocks)))
        self.inner.push_uncached(blocks, priority)

    def push_cached(self, blocks: Sequence[int], priority: int, evict_first: bool = False) -> None:
        keys = tuple(self.key_of(b) for b in blocks)
        self.ops.append(("cached", tuple(blocks), priority, evict_first, keys))
        self.inner.push_cached(blocks, priority, evict_first)

    def remove(self, block: int) -> Any:
        self.ops.append(("remove", block))
        return self.inner.remove(block)

    def remove_many(self, blocks: Sequence[int]) -> list[Any]:
        return [self.remove(block) for block in blocks]

    def reinsert(self, block: int, token: Any) -> None:
        assert self.ops.pop() == ("remove", block)
        self.inner.reinsert(block, token)

    def hit(self, block: int) -> None:
        self.ops.append(("hit", block))
        self.inner.hit(block)

    def order(self) -> list[int]:
        return self.inner.order()


# ---- references: each policy's definition, in the plainest code ------------------------


class RefLRU:
    """vLLM: freed cached blocks at the tail in the order given, evict_first ones at the
    head (the first of them first); the head is evicted."""

    def __init__(self, num_blocks: int) -> None:
        self.queue: list[int] = []

    def push(self, blocks: Sequence[int], priority: int, early: bool, keys: Sequence[Any]) -> None:
        if early:
            self.queue[:0] = list(blocks)
        else:
            self.queue += blocks

    def evict(self) -> int:
        return self.queue.pop(0)

    def remove(self, block: int) -> None:
        self.queue.remove(block)

    def hit(self, block: int) -> None:
        pass

    def forget(self, block: int) -> None:
        pass


class RefPriority(RefLRU):
    """Largest priority value first, least recently freed first within one; evict_first
    blocks before all, the latest of them first."""

    def __init__(self, num_blocks: int) -> None:
        self.entries: dict[int, tuple[float, int]] = {}
        self.seq = 0

    def level(self, block: int, priority: int) -> float:
        return -priority

    def push(self, blocks: Sequence[int], priority: int, early: bool, keys: Sequence[Any]) -> None:
        for block in reversed(blocks) if early else blocks:
            self.seq += 1
            self.entries[block] = (
                (float("-inf"), -self.seq) if early else (self.level(block, priority), self.seq)
            )

    def evict(self) -> int:
        block = min(self.entries, key=self.entries.__getitem__)
        self.evicted(block, self.entries.pop(block))
        return block

    def evicted(self, block: int, key: tuple[float, int]) -> None:
        pass

    def remove(self, block: int) -> None:
        del self.entries[block]


class RefLFU(RefPriority):
    """LFU-DA: key ``age + uses`` (uses: 1 + hits since cached), oldest freed first among
    equals; ``age`` becomes the key of each evicted block; eviction resets the hits."""

    def __init__(self, num_blocks: int) -> None:
        super().__init__(num_blocks)
        self.age = 0.0
        self.hits: dict[int, int] = {}

    def level(self, block: int, priority: int) -> float:
        return self.age + 1 + self.hits.get(block, 0)

    def evicted(self, block: int, key: tuple[float, int]) -> None:
        self.age = max(self.age, key[0])
        self.hits.pop(block, None)

    def hit(self, block: int) -> None:
        self.hits[block] = self.hits.get(block, 0) + 1

    def forget(self, block: int) -> None:
        self.hits.pop(block, None)


class RefS3FIFO(RefLRU):
    """S3-FIFO: S (10%), M, and G of evicted keys as large as M's capacity (90% of the
    cache). Enter M on a ghost hit (or when revived from M), else S. Evict from S while
    it holds >= 10% (or M is empty): hit >= 2 times -> to M, hits cleared; else evicted,
    key to G. From M: hits left -> back to M's tail with min(hits, 3) - 1; else evicted.
    evict_first blocks go before anything else, the latest first, without entering G."""

    def __init__(self, num_blocks: int) -> None:
        self.small: list[int] = []
        self.main: list[int] = []
        self.early: list[int] = []
        self.ghost: OrderedDict[Any, None] = OrderedDict()
        self.ghost_size = max(1, int(0.9 * num_blocks))
        self.freq: dict[int, int] = {}
        self.in_main: set[int] = set()
        self.keys: dict[int, Any] = {}

    def push(self, blocks: Sequence[int], priority: int, early: bool, keys: Sequence[Any]) -> None:
        for block, key in zip(blocks, keys, strict=True):
            self.keys[block] = key
            if early:
                continue
            if key in self.ghost:
                del self.ghost[key]
                self.in_main.add(block)
            (self.main if block in self.in_main else self.small).append(block)
        if early:
            self.early[:0] = list(blocks)

    def evict(self) -> int:
        if self.early:
            block = self.early.pop(0)
            self.keys.pop(block)
            return block
        while True:
            total = len(self.small) + len(self.main)
            if self.small and (len(self.small) >= 0.1 * total or not self.main):
                block = self.small.pop(0)
                if self.freq.get(block, 0) >= 2:
                    self.freq.pop(block)
                    self.in_main.add(block)
                    self.main.append(block)
                    continue
                self.ghost[self.keys[block]] = None
                if len(self.ghost) > self.ghost_size:
                    self.ghost.popitem(last=False)
            else:
                block = self.main.pop(0)
                hits = self.freq.get(block, 0)
                if hits:
                    self.freq[block] = min(hits, 3) - 1
                    self.main.append(block)
                    continue
            self.freq.pop(block, None)
            self.in_main.discard(block)
            self.keys.pop(block)
            return block

    def remove(self, block: int) -> None:
        for queue in (self.small, self.main, self.early):
            if block in queue:
                queue.remove(block)
                return
        raise KeyError(block)

    def hit(self, block: int) -> None:
        self.freq[block] = self.freq.get(block, 0) + 1

    def forget(self, block: int) -> None:
        self.freq.pop(block, None)
        self.in_main.discard(block)
        self.keys.pop(block, None)


REFERENCES = {"lru": RefLRU, "lfu": RefLFU, "priority": RefPriority, "s3fifo": RefS3FIFO}


class RefFreeQueue:
    """The whole free queue: uncached blocks first (the last freed first), then blocks
    never used (in id order), then cached ones in the reference policy's order."""

    def __init__(self, policy: str, num_blocks: int) -> None:
        self.stack: list[int] = []
        self.next_fresh = 1
        self.num_blocks = num_blocks
        self.cached = REFERENCES[policy](num_blocks)
        self.num_early_waiting = 0
        self.early: set[int] = set()
        self.early_skipped = 0  # cached evictions that passed over a waiting evict_first block

    def apply(self, op: Op) -> tuple[int, ...] | None:
        kind = op[0]
        if kind == "pop":
            return tuple(self.pop(op[1]))
        if kind == "uncached":
            for block in op[1]:
                self.cached.forget(block)
            self.stack.extend(reversed(op[1]))
        elif kind == "cached":
            _, blocks, priority, early, keys = op
            self.cached.push(blocks, priority, early, keys)
            if early:
                self.early.update(blocks)
        elif kind == "remove":
            self.cached.remove(op[1])
            self.early.discard(op[1])
        elif kind == "hit":
            self.cached.hit(op[1])
        return None

    def pop(self, count: int) -> list[int]:
        out = [self.stack.pop() for _ in range(min(count, len(self.stack)))]
        fresh = min(count - len(out), self.num_blocks - self.next_fresh)
        out += range(self.next_fresh, self.next_fresh + fresh)
        self.next_fresh += fresh
        while len(out) < count:
            block = self.cached.evict()
            self.early_skipped += bool(self.early) and block not in self.early
            self.early.discard(block)
            out.append(block)
        return out


def _record(policy: str, num_blocks: int) -> tuple[list[Op], int]:
    setup = dataclasses.replace(
        make_setup(num_blocks, window=8, max_model_len=512), retention="dense"
    )
    recorder = OpRecorder(make_free_queue(policy, num_blocks))
    manager = KVCacheManager(
        setup.kv_cache_config,
        setup.config,
        hash_algo="builtin",
        retention="dense",
        free_queue=recorder,
    )
    recorder.key_of = manager.block_pool.key_of
    if isinstance(recorder.inner, PolicyFreeQueue):
        recorder.inner.key_of = manager.block_pool.key_of
    hasher = manager.hasher

    def make_request(request_id: str, token_ids: list[int]) -> Request:
        return Request(request_id, token_ids, hasher=hasher)

    sim = Simulator(
        manager,
        make_request=make_request,
        max_model_len=manager.max_model_len,
        block_size=4,
        num_blocks=num_blocks,
        settings=SchedulerSettings(max_num_seqs=8, max_num_batched_tokens=256),
    )
    config = SyntheticTraceConfig(
        num_requests=150,
        seed=11,
        system_prompt_tokens=(20, 60),
        user_tokens=(4, 24),
        output_tokens=(1, 12),
        max_prompt_tokens=300,
    )
    result = sim.run(synthetic_trace(config))
    assert result.requests_done == 150
    return recorder.ops, result.evictions or 0


@pytest.mark.parametrize("policy", sorted(REFERENCES))
def test_policy_victims_match_the_reference(policy: str) -> None:
    num_blocks = 160
    ops, num_evictions = _record(policy, num_blocks)
    assert num_evictions > 300  # the sequence exercises eviction
    assert any(op[0] == "cached" and op[3] for op in ops)  # and evict_first frees
    assert any(op[0] == "hit" for op in ops)
    fresh = make_free_queue(policy, num_blocks)
    keys: dict[int, Any] = {}
    if isinstance(fresh, PolicyFreeQueue):
        fresh.key_of = keys.__getitem__
    ref = RefFreeQueue(policy, num_blocks)
    for i, op in enumerate(ops):
        expected = ref.apply(op)
        if op[0] == "pop":
            got = tuple(fresh.pop(op[1])[0])
            assert got == expected == op[2], f"op {i}: {policy} chose {got}, reference {expected}"
        elif op[0] == "uncached":
            fresh.push_uncached(op[1], 0)
        elif op[0] == "cached":
            keys.update(zip(op[1], op[4], strict=True))
            fresh.push_cached(op[1], op[2], op[3])
        elif op[0] == "remove":
            fresh.remove(op[1])
        else:
            fresh.hit(op[1])
    assert ref.early_skipped == 0  # an evict_first block always went before any other
