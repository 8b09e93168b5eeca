"""Per-request and per-transfer bookkeeping of the host tier."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["PendingTransfer", "Publication", "RequestResidency"]


@dataclass
class Publication:
    """A host prefix waiting to be prefix-cached once its pages are durable."""

    request: Any
    num_tokens: int
    num_pages: int
    # Set when a finished request is freed with write-backs in flight: its first
    # ``num_pages`` host blocks (referenced until they publish) and how many were cached.
    detached_blocks: list[int] | None = None
    num_cached_blocks: int = 0


@dataclass
class RequestResidency:
    """One request's pages. A page is dirty (only its GPU copy is written), then clean
    (``valid_pages``: its host copy is complete). ``ready_prefix_pages`` counts the leading
    clean pages, the prefix that may be published. ``pending_pages`` maps a page to its
    in-flight transfer. The worker holds the residency of every page below
    ``synced_pages`` except ``stale_pages``."""

    valid_pages: set[int] = field(default_factory=set)
    ready_prefix_pages: int = 0
    pending_pages: dict[int, int] = field(default_factory=dict)
    publication: Publication | None = None
    synced_pages: int = 0
    stale_pages: set[int] = field(default_factory=set)

    def advance_ready_prefix(self) -> None:
        while self.ready_prefix_pages in self.valid_pages:
            self.ready_prefix_pages += 1


@dataclass
class PendingTransfer:
    """A planned transfer; it holds one reference on each endpoint until every worker
    that enqueued it reports it complete."""

    transfer_id: int
    request_id: str
    page: int
    state: RequestResidency
    host_block: int
    resident_blocks: tuple[int, ...]
    restore: bool = False
    expected_completions: int = 0
    completions: int = 0

    @property
    def done(self) -> bool:
        return 0 < self.expected_completions <= self.completions
