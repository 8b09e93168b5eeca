"""A platform plugin for hardware this machine does not have: detect() returns None."""

from __future__ import annotations

CALLS: list[int] = []


def detect() -> str | None:
    CALLS.append(1)
    return None
