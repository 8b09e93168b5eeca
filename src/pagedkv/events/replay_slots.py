"""A cap on the replay requests open at once among subscribers that share it.

Each replay request holds a DEALER socket (two file descriptors: its mailbox and its
TCP connection) until it is answered or given up. A consumer of many publishers that
asks all of them at once (a sync, or every quiet engine's tail) would need twice as
many descriptors as it has publishers on top of their SUB sockets; with a shared
``ReplaySlots`` the requests past ``limit`` wait for a slot instead. Not thread-safe:
the subscribers sharing it belong to one thread.
"""

from __future__ import annotations

from pagedkv.errors import ConfigError

__all__ = ["ReplaySlots"]


class ReplaySlots:
    """At most ``limit`` replay requests open at once."""

    def __init__(self, limit: int) -> None:
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ConfigError(f"max_replays must be a positive integer, got {limit!r}")
        self.limit = limit
        self.in_use = 0

    @property
    def free(self) -> int:
        return self.limit - self.in_use

    def acquire(self) -> bool:
        """Take a slot; False (and nothing taken) when all are in use."""
        if self.in_use >= self.limit:
            return False
        self.in_use += 1
        return True

    def release(self) -> None:
        if self.in_use <= 0:
            raise RuntimeError("replay slots: released more slots than were taken")
        self.in_use -= 1
