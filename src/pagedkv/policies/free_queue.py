"""``PolicyFreeQueue``: the runtime's ``FreeQueue`` with the cached part ordered by an
``EvictionPolicy``; ``make_free_queue`` builds the queue for a policy name.

Uncached free blocks keep vLLM's order (the most recently freed handed out first, then
never-used blocks in id order); cached blocks are evicted in the policy's order.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from pagedkv.policies.base import EvictionPolicy
from pagedkv.policies.registry import get_policy
from pagedkv.runtime.free_queue import FreeQueue, LRUFreeQueue

KeyOf = Callable[[int], Any]


class PolicyFreeQueue(FreeQueue):
    """``key_of(block)`` gives a cached block's key (for policies with a ghost list);
    set it after the pool exists (``make_kv_cache_manager`` sets the pool's ``key_of``)."""

    def __init__(self, policy: EvictionPolicy, key_of: KeyOf | None = None) -> None:
        self.policy = policy
        self.num_blocks = policy.num_blocks
        self.key_of = key_of
        self._stack: list[int] = []
        self._next_fresh = 1  # block 0 is the null block
        cls = type(policy)
        self.wants_hits = cls.hit is not EvictionPolicy.hit  # type: ignore[misc]
        self._uses_keys = cls.uses_keys

    def __len__(self) -> int:
        return len(self._stack) + self.num_blocks - self._next_fresh + len(self.policy)

    def pop(self, num_blocks: int) -> tuple[list[int], Any]:
        stack = self._stack
        if num_blocks <= len(stack):
            blocks = stack[len(stack) - num_blocks :]
            del stack[len(stack) - num_blocks :]
            blocks.reverse()
            return blocks, None
        blocks = stack[::-1]
        stack.clear()
        from_stack = len(blocks)
        rest = num_blocks - from_stack
        fresh = min(rest, self.num_blocks - self._next_fresh)
        if fresh:
            blocks.extend(range(self._next_fresh, self._next_fresh + fresh))
            self._next_fresh += fresh
            rest -= fresh
        tokens: list[Any] = []
        if rest:
            victims, tokens = self.policy.pop_blocks(rest)
            blocks.extend(victims)
        return blocks, (from_stack, fresh, tokens)

    def unpop(self, blocks: list[int], token: Any) -> None:
        if token is None:
            self._stack.extend(reversed(blocks))
            return
        from_stack, fresh, tokens = token
        unpop = self.policy.unpop
        for block, t in zip(reversed(blocks[from_stack + fresh :]), reversed(tokens)):
            unpop(block, t)
        self._next_fresh -= fresh
        self._stack.extend(reversed(blocks[:from_stack]))

    def push_uncached(self, blocks: Sequence[int], priority: int) -> None:
        self._stack.extend(reversed(blocks))

    def push_cached(self, blocks: Sequence[int], priority: int, evict_first: bool = False) -> None:
        key_of = self.key_of if self._uses_keys else None
        policy = self.policy
        if evict_first:
            for block in reversed(blocks):
                policy.push_early(block, key_of(block) if key_of else None)
        else:
            policy.push_blocks(blocks, priority, [key_of(b) for b in blocks] if key_of else ())

    def remove(self, block: int) -> Any:
        return self.policy.remove(block)

    def reinsert(self, block: int, token: Any) -> None:
        self.policy.restore(block, token)

    def hit(self, block: int) -> None:
        self.policy.hit(block)

    def unhit(self, block: int) -> None:
        self.policy.unhit(block)

    def order(self) -> list[int]:
        fresh = range(self._next_fresh, self.num_blocks)
        return [*reversed(self._stack), *fresh, *self.policy.order()]


def make_free_queue(name: str, num_blocks: int) -> FreeQueue:
    """The free queue of policy ``name``: ``lru`` is the runtime's own (vLLM's order,
    unchanged); any other registered name orders the cached blocks by that policy."""
    if name == "lru":
        return LRUFreeQueue(num_blocks)
    return PolicyFreeQueue(get_policy(name)(num_blocks))
