"""Each eviction policy on its own and inside the policy free queue: a model of the held
set, exact undo of any mix of pops and removals (by replay, no undo in the policy), and
each policy's own ordering rule."""

from __future__ import annotations

import copy
from typing import Any

import hypothesis.strategies as st
import pytest
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from pagedkv.errors import ConfigError, KVCacheRuntimeError
from pagedkv.policies import (
    PolicyFreeQueue,
    get_policy,
    policy_names,
    register_policy,
)
from pagedkv.runtime.replay import CallReplay

NUM_BLOCKS = 24
POLICIES = ["lfu", "priority", "s3fifo", "s3fifo-pagedkv"]


def snapshot(queue: PolicyFreeQueue) -> object:
    policy = queue.policy
    state = copy.deepcopy(policy.__dict__)
    heap = state.pop("_heap", None)
    return state, None if heap is None else dict(heap.keys), queue.order()


class PolicyMachine(RuleBasedStateMachine):
    """The policy behind a ``PolicyFreeQueue``, driven as the pool drives it: frees
    outside a transaction, pops and revivals inside one, hits at the commit, and a
    rollback that must leave the policy exactly as it was."""

    name = "lfu"

    def __init__(self) -> None:
        super().__init__()
        self.keys: dict[int, Any] = {}
        policy = get_policy(self.name)(NUM_BLOCKS)
        self.queue = PolicyFreeQueue(policy, key_of=self.keys.__getitem__)
        self.used: set[int] = set(self.queue.pop(len(self.queue))[0])  # every block taken
        self.free: set[int] = set()
        self.undo: list[tuple[str, list[int], object]] | None = None
        self.saved: object = None

    def _free(self, index: int) -> int:
        block = sorted(self.used)[index % len(self.used)]
        self.used.remove(block)
        self.free.add(block)
        return block

    @precondition(lambda self: self.used and self.undo is None)
    @rule(index=st.integers(0, 99), priority=st.integers(0, 3), key=st.integers(0, 30))
    def free_cached(self, index: int, priority: int, key: int) -> None:
        block = self._free(index)
        self.keys[block] = ("h", key)
        self.queue.push_cached([block], priority)

    @precondition(lambda self: self.used and self.undo is None)
    @rule(index=st.integers(0, 99))
    def free_early(self, index: int) -> None:
        block = self._free(index)
        self.keys[block] = ("h", block)
        self.queue.push_cached([block], 0, evict_first=True)

    @precondition(lambda self: self.used and self.undo is None)
    @rule(index=st.integers(0, 99))
    def free_uncached(self, index: int) -> None:
        self.queue.push_uncached([self._free(index)], 0)

    @precondition(lambda self: self.free)
    @rule(count=st.integers(1, 3))
    def evict(self, count: int) -> None:
        count = min(count, len(self.free))
        blocks, token = self.queue.pop(count)
        assert set(blocks) <= self.free and len(set(blocks)) == count
        self.free -= set(blocks)
        self.used |= set(blocks)
        if self.undo is not None:
            self.undo.append(("pop", blocks, token))

    @precondition(lambda self: self.free)
    @rule(index=st.integers(0, 99))
    def revive(self, index: int) -> None:
        block = sorted(self.free)[index % len(self.free)]
        token = self.queue.remove(block)
        self.free.remove(block)
        self.used.add(block)
        if self.undo is not None:
            self.undo.append(("remove", [block], token))  # its hit waits for the commit
        else:
            self.queue.hit(block)

    @rule(index=st.integers(0, 99))
    def hit_in_use(self, index: int) -> None:
        if self.used and self.undo is None:
            self.queue.hit(sorted(self.used)[index % len(self.used)])

    @precondition(lambda self: self.undo is None)
    @rule()
    def begin(self) -> None:
        self.saved = snapshot(self.queue)
        self.undo = []

    @precondition(lambda self: self.undo is not None)
    @rule(commit=st.booleans())
    def end(self, commit: bool) -> None:
        undo, self.undo = self.undo or [], None
        if commit:
            for kind, blocks, _ in undo:
                if kind == "remove":
                    self.queue.hit(blocks[0])
            return
        for kind, blocks, token in reversed(undo):
            if kind == "pop":
                self.queue.unpop(blocks, token)
            else:
                self.queue.reinsert(blocks[0], token)
            self.used -= set(blocks)
            self.free |= set(blocks)
        assert snapshot(self.queue) == self.saved

    @invariant()
    def held_set(self) -> None:
        assert len(self.queue) == len(self.free)
        assert sorted(self.queue.order()) == sorted(self.free)


def machine_for(name: str) -> type[PolicyMachine]:
    return type(f"{name}Machine", (PolicyMachine,), {"name": name})


@pytest.mark.parametrize("name", POLICIES)
@pytest.mark.slow
def test_policy_state_machine(name: str) -> None:
    case = machine_for(name).TestCase
    case.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
    case().runTest()


def test_registry_names_and_errors() -> None:
    assert {"lfu", "priority", "s3fifo"} <= set(policy_names())
    with pytest.raises(ConfigError, match=r"unknown eviction policy 'nope'.*lfu"):
        get_policy("nope")
    with pytest.raises(ConfigError, match="already registered"):
        register_policy("lfu")(type("Other", (), {}))


def test_priority_evicts_least_important_first_lru_within() -> None:
    policy = get_policy("priority")(10)
    for block, prio in [(1, 5), (2, 1), (3, 5), (4, 1), (5, 9)]:
        policy.push(block, prio)
    policy.push_early(6)
    # vLLM's convention: a larger value is less important, so it goes first
    assert policy.order() == [6, 5, 1, 3, 2, 4]


def test_lfu_keeps_hit_blocks_and_ages() -> None:
    policy = get_policy("lfu")(10)
    policy.hit(1)
    policy.hit(1)
    for block in (1, 2, 3):
        policy.push(block)
    assert policy.order() == [2, 3, 1]
    assert [policy.pop() for _ in range(2)] == [2, 3]
    assert policy.age == 1
    # After aging a newcomer with one use ties with block 1's three uses only later on.
    policy.push(4)
    assert policy.order() == [4, 1]  # key 2 < key 3


@pytest.mark.parametrize(("name", "hits"), [("s3fifo", 2), ("s3fifo-pagedkv", 1)])
def test_s3fifo_is_scan_resistant(name: str, hits: int) -> None:
    # the published rule promotes a block hit twice in S; the variant after one hit
    policy = get_policy(name)(100)
    hot = list(range(1, 11))
    for block in hot:
        for _ in range(hits):
            policy.hit(block)
        policy.push(block, key=("hot", block))
    scan = list(range(11, 61))
    for block in scan:
        policy.push(block, key=("scan", block))
    victims = [policy.pop() for _ in range(45)]
    assert set(victims) <= set(scan)  # the one-off blocks go first, the hot ones stay
    lru_victims = list(range(1, 46))  # what LRU (freed order) would have evicted
    assert not set(hot) & set(victims) and set(hot) <= set(lru_victims)
    # an evicted scan key returns through the ghost list into the main queue
    policy.push(11, key=("scan", 11))
    assert 11 in policy.in_main


def test_s3fifo_needs_more_than_one_hit_to_promote() -> None:
    published, variant = get_policy("s3fifo")(100), get_policy("s3fifo-pagedkv")(100)
    for policy in (published, variant):
        policy.hit(1)
        for block in range(1, 5):
            policy.push(block, key=block)
    assert published.pop() == 1  # one hit is not enough
    assert variant.pop() == 2  # the variant promoted it


def test_replay_folds_its_log_and_still_undoes_the_open_change() -> None:
    """Past the fold threshold the log restarts from a new copy; an undo inside the next
    allocation still lands exactly, and one reaching behind the fold is refused."""
    queue = PolicyFreeQueue(get_policy("lfu")(8))
    queue.pop(len(queue))
    replay: CallReplay[Any] = queue._replay
    for round_ in range(1200):  # 2,400 calls: past the 1,024-call threshold
        queue.push_cached([1 + round_ % 7], 0)
        queue.pop(1)
    assert replay._first > 0 and len(replay._calls) <= replay._fold_after_entries
    queue.push_cached([3, 4], 0)
    before = queue.order()
    blocks, token = queue.pop(1)
    queue.unpop(blocks, token)
    assert queue.order() == before
    with pytest.raises(KVCacheRuntimeError, match="folded"):
        replay.rewind(replay._first - 1)


def test_a_failed_policy_pop_changes_nothing() -> None:
    """A policy raising inside ``pop`` leaves neither its half-done change nor the
    uncached blocks already taken from the head."""

    class Flaky(get_policy("priority")):  # type: ignore[misc]
        fail = False

        def pop_blocks(self, count: int) -> list[int]:
            victims = super().pop_blocks(1)
            if Flaky.fail:
                raise RuntimeError("injected")
            return victims + super().pop_blocks(count - 1)

    queue = PolicyFreeQueue(Flaky(8))
    queue.pop(len(queue))
    queue.push_cached([1, 2, 3], 0)
    queue.push_uncached([4], 0)
    before = queue.order()
    Flaky.fail = True
    with pytest.raises(RuntimeError, match="injected"):
        queue.pop(3)
    Flaky.fail = False
    assert queue.order() == before == [4, 1, 2, 3]


def test_an_unpicklable_policy_is_refused_by_name() -> None:
    class Locked(get_policy("priority")):  # type: ignore[misc]
        def __init__(self, num_blocks: int) -> None:
            super().__init__(num_blocks)
            self.callback = lambda: None

    with pytest.raises(ConfigError, match="Locked cannot be pickled"):
        PolicyFreeQueue(Locked(8))
    for name in POLICIES:  # every bundled policy is plain data
        assert PolicyFreeQueue(get_policy(name)(8)).order() == list(range(1, 8))


def test_the_documented_rollback_example() -> None:
    """docs/runtime.md's example: under ``lfu`` a revival of block 2 and an eviction of
    block 1 are rolled back; both are free again in the order they had."""
    queue = PolicyFreeQueue(get_policy("lfu")(3))
    assert queue.pop(2)[0] == [1, 2]
    queue.push_cached([1], 0)
    queue.push_cached([2], 0)
    before = snapshot(queue)
    removed = queue.remove(2)  # the token: where the log ended before the revival
    blocks, token = queue.pop(1)
    assert blocks == [1] and token.position > removed
    queue.unpop(blocks, token)
    queue.reinsert(2, removed)
    assert snapshot(queue) == before and queue.order() == [1, 2]
