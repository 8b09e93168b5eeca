"""``PolicyFreeQueue``: the runtime's ``FreeQueue`` with the cached part ordered by an
``EvictionPolicy``; ``make_free_queue`` builds the queue for a policy name.

Uncached free blocks keep vLLM's order (the most recently freed handed out first, then
never-used blocks in id order); cached blocks are evicted in the policy's order.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from pagedkv.policies.base import EvictionPolicy
from pagedkv.policies.registry import get_policy
from pagedkv.runtime.free_queue import FreeQueue, LRUFreeQueue
from pagedkv.runtime.replay import CallReplay

__all__ = [
    "KeyOf",
    "PolicyFreeQueue",
    "make_free_queue",
]

KeyOf = Callable[[int], Any]


class PolicyFreeQueue(FreeQueue):
    """``key_of(block)`` gives a cached block's key (for policies with a ghost list);
    set it after the pool exists (``make_kv_cache_manager`` sets the pool's ``key_of``).
    The uncached and never-used blocks are an ``LRUFreeQueue`` that never holds a cached
    block (``_head``). Every call that changes the policy goes through ``_replay``, which
    undoes a rolled-back ``pop`` or ``remove`` for the policy."""

    def __init__(self, policy: EvictionPolicy, key_of: KeyOf | None = None) -> None:
        self._replay = CallReplay(policy, _POLICY_ARITY, max(1024, 2 * policy.num_blocks))
        self.num_blocks = policy.num_blocks
        self.key_of = key_of
        self._head = LRUFreeQueue(policy.num_blocks)
        cls = type(policy)
        self.wants_hits = cls.hit is not EvictionPolicy.hit  # type: ignore[misc]
        self._forgets = cls.forget is not EvictionPolicy.forget
        self._uses_keys = cls.uses_keys

    @property
    def policy(self) -> EvictionPolicy:
        return self._replay.target

    def __len__(self) -> int:
        return len(self._head) + len(self._replay.target)

    def pop(self, num_blocks: int) -> tuple[list[int], Any]:
        head = self._head
        num_head = len(head)
        if num_blocks <= num_head:
            blocks, token = head.pop(num_blocks)
            return blocks, _Popped(token, num_blocks, None)
        blocks, token = head.pop(num_head)
        replay = self._replay
        position = replay.position
        try:
            victims = replay.call("pop_blocks", num_blocks - num_head)
        except BaseException:
            head.unpop(blocks, token)
            raise
        return blocks + victims, _Popped(token, num_head, position)

    def unpop(self, blocks: list[int], token: Any) -> None:
        if token.position is not None:
            self._replay.rewind(token.position)
        self._head.unpop(blocks[: token.num_head], token.head)

    def push_uncached(self, blocks: Sequence[int], priority: int) -> None:
        if self._forgets:  # freed without a hash: its content (and hit history) is gone
            replay = self._replay
            for block in blocks:
                replay.call("forget", block)
            replay.fold()
        self._head.push_uncached(blocks, priority)

    def push_cached(self, blocks: Sequence[int], priority: int, evict_first: bool = False) -> None:
        key_of = self.key_of if self._uses_keys else None
        replay = self._replay
        if evict_first:
            for block in reversed(blocks):
                replay.call("push_early", block, key_of(block) if key_of else None)
        elif len(blocks) == 1:  # ints only in the log: nothing kept alive
            block = blocks[0]
            replay.call("push", block, priority, key_of(block) if key_of else None)
        else:
            frozen = tuple(blocks)
            keys = tuple(key_of(b) for b in frozen) if key_of else ()
            replay.call("push_blocks", frozen, priority, keys)
        replay.fold()

    def remove(self, block: int) -> Any:
        replay = self._replay
        if block in replay.target:
            position = replay.position
            replay.call("remove", block)
            return position
        return _InHead(self._head.remove(block))  # an uncached free block handed in as a hit

    def reinsert(self, block: int, token: Any) -> None:
        if isinstance(token, _InHead):
            self._head.reinsert(block, token.token)
        else:
            self._replay.rewind(token)

    def hit(self, block: int) -> None:
        self._replay.call("hit", block)
        self._replay.fold()

    def order(self) -> list[int]:
        return [*self._head.order(), *self._replay.target.order()]


# The policy calls the queue logs, and their number of arguments.
_POLICY_ARITY = {
    "push": 3,
    "push_blocks": 3,
    "push_early": 2,
    "pop_blocks": 1,
    "remove": 1,
    "hit": 1,
    "forget": 1,
}


class _Popped(NamedTuple):
    """The ``pop`` token: the head's token, how many blocks came from the head, and the
    policy's position before its pops (None: none came from the policy)."""

    head: Any
    num_head: int
    position: int | None


class _InHead(NamedTuple):
    """The ``remove`` token of a block taken from the uncached part."""

    token: Any


def make_free_queue(name: str, num_blocks: int) -> FreeQueue:
    """The free queue of policy ``name``: ``lru`` is the runtime's own (vLLM's order,
    unchanged); any other registered name orders the cached blocks by that policy."""
    if name == "lru":
        return LRUFreeQueue(num_blocks)
    return PolicyFreeQueue(get_policy(name)(num_blocks))
