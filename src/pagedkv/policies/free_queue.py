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
    block (``_head``)."""

    def __init__(self, policy: EvictionPolicy, key_of: KeyOf | None = None) -> None:
        self.policy = policy
        self.num_blocks = policy.num_blocks
        self.key_of = key_of
        self._head = LRUFreeQueue(policy.num_blocks)
        cls = type(policy)
        self.wants_hits = cls.hit is not EvictionPolicy.hit  # type: ignore[misc]
        self._forgets = cls.forget is not EvictionPolicy.forget
        self._uses_keys = cls.uses_keys

    def __len__(self) -> int:
        return len(self._head) + len(self.policy)

    def pop(self, num_blocks: int) -> tuple[list[int], Any]:
        head = self._head
        num_head = len(head)
        if num_blocks <= num_head:
            blocks, token = head.pop(num_blocks)
            return blocks, (token, ())
        blocks, token = head.pop(num_head)
        victims, tokens = self.policy.pop_blocks(num_blocks - num_head)
        blocks += victims
        return blocks, (token, tokens)

    def unpop(self, blocks: list[int], token: Any) -> None:
        head_token, tokens = token
        num_head = len(blocks) - len(tokens)
        unpop = self.policy.unpop
        for block, t in zip(reversed(blocks[num_head:]), reversed(tokens)):
            unpop(block, t)
        self._head.unpop(blocks[:num_head], head_token)

    def push_uncached(self, blocks: Sequence[int], priority: int) -> None:
        if self._forgets:  # freed without a hash: its content (and hit history) is gone
            forget = self.policy.forget
            for block in blocks:
                forget(block)
        self._head.push_uncached(blocks, priority)

    def push_cached(self, blocks: Sequence[int], priority: int, evict_first: bool = False) -> None:
        key_of = self.key_of if self._uses_keys else None
        policy = self.policy
        if evict_first:
            for block in reversed(blocks):
                policy.push_early(block, key_of(block) if key_of else None)
        else:
            policy.push_blocks(blocks, priority, [key_of(b) for b in blocks] if key_of else ())

    def remove(self, block: int) -> Any:
        if block in self.policy:
            return self.policy.remove(block)
        return _InHead(self._head.remove(block))  # an uncached free block handed in as a hit

    def reinsert(self, block: int, token: Any) -> None:
        if isinstance(token, _InHead):
            self._head.reinsert(block, token.token)
        else:
            self.policy.restore(block, token)

    def hit(self, block: int) -> None:
        self.policy.hit(block)

    def order(self) -> list[int]:
        return [*self._head.order(), *self.policy.order()]


class _InHead(NamedTuple):
    """The ``remove`` token of a block taken from the uncached part."""

    token: Any


def make_free_queue(name: str, num_blocks: int) -> FreeQueue:
    """The free queue of policy ``name``: ``lru`` is the runtime's own (vLLM's order,
    unchanged); any other registered name orders the cached blocks by that policy."""
    if name == "lru":
        return LRUFreeQueue(num_blocks)
    return PolicyFreeQueue(get_policy(name)(num_blocks))
