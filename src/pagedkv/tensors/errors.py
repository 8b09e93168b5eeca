"""Errors raised when a plan cannot be laid out as torch tensors."""

from __future__ import annotations

from pagedkv.errors import PagedKVError, PlanningError

__all__ = [
    "TensorLayoutError",
    "BlockTableError",
]


class TensorLayoutError(PlanningError):
    """A layer's region cannot be viewed as a typed tensor (dtype, alignment, bounds)."""


class BlockTableError(PagedKVError, ValueError):
    """Block ids or token positions handed to the tensor helpers do not match."""
