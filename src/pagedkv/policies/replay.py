"""``PolicyReplay``: exact undo for any eviction policy, with no undo code in the policy.

The policy free queue logs every call that changes its policy, beside a pickled copy of
the policy's state as it stood when the log began. Rewinding to a position drops the log's tail
and marks the policy stale; its next use rebuilds it from the copy by replaying the log.
A policy is deterministic (the same calls leave it in the same state), so the rebuilt
policy is exactly the one that stood at that position.

Rewinds only reach back into the open transaction (a rolled-back allocation), and
``fold`` runs only outside one (frees and reported hits), so a position handed out is
never folded away. Once the log holds twice as many calls as the pool has blocks,
``fold`` replaces the copy with one of the policy as it stands: the log stays O(blocks)
long and the copy (about 0.5 us per cached block) costs O(1) per call, amortised.
"""

from __future__ import annotations

from typing import Any

from pagedkv.errors import KVCacheRuntimeError
from pagedkv.policies.base import EvictionPolicy, freeze, thaw

__all__ = [
    "PolicyReplay",
]

_MIN_FOLD_CALLS = 1024
# The calls the queue logs and their number of arguments. The log is flat and keeps at
# most one object alive per call (a multi-block push's tuple of blocks): a log of
# (method, args) tuples made single-block pushes twice as slow.
_ARITY = {
    "push": 3,
    "push_blocks": 3,
    "push_early": 2,
    "pop_blocks": 1,
    "remove": 1,
    "hit": 1,
    "forget": 1,
}
_ENTRIES_PER_CALL = 3


class PolicyReplay:
    """The policy, a pickled copy of it and the calls made since that copy."""

    def __init__(self, policy: EvictionPolicy) -> None:
        self._policy = policy
        self._copy = freeze(policy)
        # Flat: a method name, then its arguments (``_ARITY``); positions count entries.
        self._calls: list[Any] = []
        self._first = 0  # the position of _calls[0]
        self._stale = False
        self._fold_after = _ENTRIES_PER_CALL * max(_MIN_FOLD_CALLS, 2 * policy.num_blocks)

    @property
    def policy(self) -> EvictionPolicy:
        """The policy as of the latest call (rebuilt here after a rewind)."""
        if self._stale:
            self._rebuild()
        return self._policy

    @property
    def position(self) -> int:
        """Where the log ends now, counted over the policy's whole life."""
        return self._first + len(self._calls)

    def log(self, method: str, *args: Any) -> None:
        """``policy.<method>(*args)`` was just called (and changed the policy)."""
        calls = self._calls
        calls.append(method)
        calls += args

    def rewind(self, position: int) -> None:
        """Back to the policy as it stood when ``position`` was read."""
        if position < self._first:
            raise KVCacheRuntimeError(
                f"eviction policy {type(self._policy).__name__}: cannot undo to call "
                f"{position}, the log was folded at call {self._first} (an undo outside "
                f"the allocation that made the change)"
            )
        del self._calls[position - self._first :]
        self._stale = True

    def fold(self) -> None:
        """Outside any transaction: start a new copy once the log is long."""
        if len(self._calls) > self._fold_after:
            policy = self.policy
            self._copy = freeze(policy)
            self._first += len(self._calls)
            self._calls = []

    def _rebuild(self) -> None:
        policy = thaw(type(self._policy), self._copy)
        calls = self._calls
        i = 0
        while i < len(calls):
            method = calls[i]
            end = i + 1 + _ARITY[method]
            getattr(policy, method)(*calls[i + 1 : end])
            i = end
        self._policy = policy
        self._stale = False
