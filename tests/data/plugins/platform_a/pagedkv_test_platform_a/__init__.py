"""Test platform plugin A. ``EVENTS`` records what ran, in order."""

EVENTS: list[tuple[str, bool]] = []
