"""Each eviction policy on its own: a model of the held set, exact undo of any mix of
pops and removals, and each policy's own ordering rule."""

from __future__ import annotations

import copy

import hypothesis.strategies as st
import pytest
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from pagedkv.errors import ConfigError
from pagedkv.policies import EvictionPolicy, get_policy, policy_names, register_policy

NUM_BLOCKS = 24
POLICIES = ["lfu", "priority", "s3fifo", "s3fifo-pagedkv"]


def snapshot(policy: EvictionPolicy) -> object:
    state = copy.deepcopy(policy.__dict__)
    heap = state.pop("_heap", None)
    return state, None if heap is None else dict(heap.keys), policy.order()


class PolicyMachine(RuleBasedStateMachine):
    name = "lfu"

    def __init__(self) -> None:
        super().__init__()
        self.policy: EvictionPolicy = get_policy(self.name)(NUM_BLOCKS)
        self.free: set[int] = set()
        self.used: set[int] = set(range(NUM_BLOCKS))
        self.undo: list[tuple[str, int, object]] | None = None
        self.saved: object = None

    @precondition(lambda self: self.used)
    @rule(index=st.integers(0, 99), priority=st.integers(0, 3), key=st.integers(0, 30))
    def free_block(self, index: int, priority: int, key: int) -> None:
        if self.undo is not None:
            return  # frees never happen inside an allocation
        block = sorted(self.used)[index % len(self.used)]
        self.policy.push(block, priority, ("h", key))
        self.used.remove(block)
        self.free.add(block)

    @precondition(lambda self: self.used and self.undo is None)
    @rule(index=st.integers(0, 99))
    def free_early(self, index: int) -> None:
        block = sorted(self.used)[index % len(self.used)]
        self.policy.push_early(block, ("h", block))
        self.used.remove(block)
        self.free.add(block)

    @precondition(lambda self: self.free)
    @rule()
    def evict(self) -> None:
        block, token = self.policy.pop()
        assert block in self.free
        self.free.remove(block)
        self.used.add(block)
        if self.undo is not None:
            self.undo.append(("pop", block, token))
        else:
            self.policy.forget(block)

    @precondition(lambda self: self.free)
    @rule(index=st.integers(0, 99))
    def revive(self, index: int) -> None:
        block = sorted(self.free)[index % len(self.free)]
        token = self.policy.remove(block)
        self.free.remove(block)
        self.used.add(block)
        if self.undo is not None:
            self.undo.append(("remove", block, token))  # its hit waits for the commit
        else:
            self.policy.hit(block)

    @rule(index=st.integers(0, 99))
    def hit_in_use(self, index: int) -> None:
        if self.used and self.undo is None:
            self.policy.hit(sorted(self.used)[index % len(self.used)])

    @precondition(lambda self: self.undo is None)
    @rule()
    def begin(self) -> None:
        self.saved = snapshot(self.policy)
        self.undo = []

    @precondition(lambda self: self.undo is not None)
    @rule(commit=st.booleans())
    def end(self, commit: bool) -> None:
        undo, self.undo = self.undo or [], None
        if commit:
            for kind, block, _ in undo:
                if kind == "pop":
                    self.policy.forget(block)
                else:
                    self.policy.hit(block)
            return
        for kind, block, token in reversed(undo):
            if kind == "pop":
                self.policy.unpop(block, token)
            else:
                self.policy.restore(block, token)
            self.used.remove(block)
            self.free.add(block)
        assert snapshot(self.policy) == self.saved

    @invariant()
    def held_set(self) -> None:
        assert len(self.policy) == len(self.free)
        assert all(b in self.policy for b in self.free)
        assert sorted(self.policy.order()) == sorted(self.free)


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
    assert [policy.pop()[0] for _ in range(2)] == [2, 3]
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
    victims = [policy.pop()[0] for _ in range(45)]
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
    assert published.pop()[0] == 1  # one hit is not enough
    assert variant.pop()[0] == 2  # the variant promoted it
