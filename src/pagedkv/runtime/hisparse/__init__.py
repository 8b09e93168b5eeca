"""HiSparse's host tier: write-back of GPU resident pages to the host pool, durable-prefix
publication, row mirrors and residency updates for the worker."""

from pagedkv.runtime.hisparse.host_pool import HOST_MEDIUM, HostBlockPool
from pagedkv.runtime.hisparse.state import PendingTransfer, Publication, RequestResidency
from pagedkv.runtime.hisparse.tier import (
    HiSparseTier,
    ScheduledRows,
    bind_hisparse_tier,
    mirror_window,
)
from pagedkv.runtime.hisparse.transfers import (
    OffloadCommand,
    PageTransfer,
    ResidencyUpdate,
    RowMirror,
)

__all__ = [
    "HOST_MEDIUM",
    "HostBlockPool",
    "HiSparseTier",
    "OffloadCommand",
    "PageTransfer",
    "PendingTransfer",
    "Publication",
    "RequestResidency",
    "ResidencyUpdate",
    "RowMirror",
    "ScheduledRows",
    "bind_hisparse_tier",
    "mirror_window",
]
