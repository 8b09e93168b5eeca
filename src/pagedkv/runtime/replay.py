"""Undo by replay: exact undo for plugin state whose author writes no undo code.

A ``CallReplay`` makes every call that changes its target (an eviction policy, a free
queue) and logs it beside a pickled copy of the target's state as it stood when the log began.
Rewinding to a position drops the log's tail and marks the target stale; its next use
rebuilds it from the copy by replaying the log. The target is deterministic (the same
calls leave it in the same state), so the rebuilt target is exactly the one that stood at
that position.

Rewinds only reach back into the open transaction (a rolled-back allocation), and
``fold`` runs only outside one (frees and reported hits), so a position handed out is
never folded away. Once the log holds ``fold_after`` calls, ``fold`` replaces the copy
with one of the target as it stands: with ``fold_after`` about twice the pool's blocks,
the log stays O(blocks) long and the copy (about 0.5 us per cached block for the bundled
policies) costs O(1) per call, amortised.
"""

from __future__ import annotations

import pickle
from collections.abc import Mapping
from typing import Any, Generic, TypeVar

from pagedkv.errors import ConfigError, KVCacheRuntimeError

__all__ = [
    "CallReplay",
    "freeze",
    "thaw",
]

T = TypeVar("T")


class CallReplay(Generic[T]):
    """The target, a pickled copy of it and the calls made since that copy.

    Args:
        target: the object whose calls are logged (its attributes must pickle).
        arity: each logged method's number of arguments.
        fold_after: calls after which ``fold`` starts a new copy.
    """

    def __init__(self, target: T, arity: Mapping[str, int], fold_after: int) -> None:
        self._target = target
        self._arity = arity
        self._copy = freeze(target)
        # Flat: a method name, then its arguments; positions count entries. A log of
        # (method, args) tuples kept three objects alive per call and made single-block
        # pushes twice as slow.
        self._calls: list[Any] = []
        self._first = 0  # the position of _calls[0]
        self._stale = False
        self._fold_after_entries = fold_after * (1 + max(arity.values(), default=0))

    @property
    def target(self) -> T:
        """The target as of the latest call (rebuilt here after a rewind)."""
        if self._stale:
            self._rebuild()
        return self._target

    @property
    def position(self) -> int:
        """Where the log ends now, counted over the target's whole life."""
        return self._first + len(self._calls)

    def call(self, method: str, *args: Any) -> Any:
        """``target.<method>(*args)``, logged; a call that raises is undone, then re-raised."""
        position = self.position
        try:
            result = getattr(self.target, method)(*args)
        except BaseException:
            self.rewind(position)  # whatever the failed call changed
            raise
        calls = self._calls
        calls.append(method)
        calls += args
        return result

    def rewind(self, position: int) -> None:
        """Back to the target as it stood when ``position`` was read."""
        if position < self._first:
            raise KVCacheRuntimeError(
                f"{type(self._target).__name__}: cannot undo to log position {position}, "
                f"the log was folded at {self._first} (an undo outside the allocation "
                f"that made the change)"
            )
        del self._calls[position - self._first :]
        self._stale = True

    def fold(self) -> None:
        """Outside any transaction: start a new copy once the log is long."""
        if len(self._calls) > self._fold_after_entries:
            target = self.target
            self._copy = freeze(target)
            self._first += len(self._calls)
            self._calls = []

    def _rebuild(self) -> None:
        target = thaw(type(self._target), self._copy)
        calls, arity = self._calls, self._arity
        i = 0
        while i < len(calls):
            method = calls[i]
            end = i + 1 + arity[method]
            getattr(target, method)(*calls[i + 1 : end])
            i = end
        self._target = target
        self._stale = False


def freeze(obj: object) -> bytes:
    """The object's state (its attributes) pickled; ``thaw`` makes a copy from it. The
    class itself is not pickled, so a class defined anywhere (a function, a test) can be
    copied. ConfigError when an attribute cannot be pickled."""
    try:
        return pickle.dumps(vars(obj), protocol=pickle.HIGHEST_PROTOCOL)
    except (pickle.PicklingError, TypeError, AttributeError) as exc:
        raise ConfigError(
            f"{type(obj).__qualname__} cannot be pickled ({exc}); a free queue or eviction "
            f"policy that writes no undo keeps plain data (ints, dicts, lists, sets, its "
            f"keys) so that a rolled-back allocation can restore it"
        ) from exc


def thaw(cls: type[T], state: bytes) -> T:
    """A new ``cls`` object with the state ``freeze`` returned."""
    obj = cls.__new__(cls)
    vars(obj).update(pickle.loads(state))
    return obj
