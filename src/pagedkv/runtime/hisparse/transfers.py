"""What the host tier hands the worker each step: page transfers between a resident GPU
page and its host block, row mirrors of freshly written rows, and residency updates."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["OffloadCommand", "PageTransfer", "ResidencyUpdate", "RowMirror"]


@dataclass(frozen=True)
class PageTransfer:
    """Copy one logical page between its resident GPU blocks (one per resident group) and
    its host block: a write-back (``restore=False``) or a host-to-GPU restore."""

    transfer_id: int
    host_block_id: int
    resident_block_ids: tuple[int, ...]
    after_forward: bool
    restore: bool = False


@dataclass(frozen=True)
class RowMirror:
    """Mirror ``num_rows`` contiguous token rows of one page into the host pool: the row
    offsets are ``block_id * block_size + row`` in each resident group and on the host."""

    source_starts: tuple[int, ...]
    destination_start: int
    num_rows: int


@dataclass(frozen=True)
class ResidencyUpdate:
    """GPU block ids of some of a request's pages, per resident group; the null block
    (0) means the page is read from the host."""

    pages: list[int]
    block_ids: tuple[list[int], ...]


@dataclass
class OffloadCommand:
    """The page transfers planned since the last command."""

    page_transfers: list[PageTransfer]
