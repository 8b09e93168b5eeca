"""Making page sizes equal so groups of different kinds can share layer slots.

A layer's page is fitted to a target page ``P`` by raising its block size (the page
grows with it) and padding what is left. Mamba states do not grow with the block
size: they are padded to ``P``, and in an attention + Mamba hybrid the attention
block size is first raised until one attention page holds a Mamba state.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence

from pagedkv.specs.base import AttentionSpec, KVCacheSpec, cdiv
from pagedkv.specs.full import MLAAttentionSpec
from pagedkv.specs.local import SlidingWindowMLASpec
from pagedkv.specs.mamba import MambaSpec


def is_state_spec(spec: KVCacheSpec) -> bool:
    """Pages that hold a fixed-size state whatever the block size."""
    return isinstance(spec, MambaSpec)


def can_pad(spec: KVCacheSpec) -> bool:
    """MLA kernels read latents densely, so MLA pages are never padded."""
    if isinstance(spec, MLAAttentionSpec | SlidingWindowMLASpec):
        return False
    return any(f.name == "page_size_padded" for f in dataclasses.fields(spec))


def bytes_per_token(spec: KVCacheSpec) -> int:
    if isinstance(spec, AttentionSpec):
        return spec.bytes_per_token
    return cdiv(spec.real_page_size_bytes, spec.block_size)


def pad_to(spec: KVCacheSpec, page_bytes: int) -> KVCacheSpec | None:
    """``spec`` with its page padded to ``page_bytes`` (None when it cannot be)."""
    if spec.page_size_bytes == page_bytes:
        return spec
    if spec.real_page_size_bytes > page_bytes or not can_pad(spec):
        return None
    padded = None if spec.real_page_size_bytes == page_bytes else page_bytes
    return dataclasses.replace(spec, page_size_padded=padded)  # type: ignore[call-arg]


def fit_page(
    spec: KVCacheSpec,
    page_bytes: int,
    *,
    state_block_size: int,
    scale_then_pad: bool = True,
) -> KVCacheSpec | None:
    """``spec`` refitted so its page is exactly ``page_bytes``, or None.

    State specs take ``state_block_size`` and are padded. Other specs have their
    block size multiplied by the largest factor whose page still fits, then are
    padded (``scale_then_pad``); with ``scale_then_pad=False`` (vLLM's rule) the
    block size is scaled only when the page divides ``page_bytes`` exactly, else
    the page is padded at its current block size.
    """
    if is_state_spec(spec):
        if spec.real_page_size_bytes > page_bytes:
            return None
        return pad_to(dataclasses.replace(spec, block_size=state_block_size), page_bytes)
    page = spec.page_size_bytes
    if page == page_bytes:
        return spec
    if page > page_bytes:
        return None
    factor = page_bytes // page
    if factor > 1 and (scale_then_pad or page_bytes % page == 0):
        spec = spec.copy_with_new_block_size(spec.block_size * factor)
        if spec.page_size_bytes > page_bytes:
            return None
    return pad_to(spec, page_bytes)


def lcm_all(values: Iterable[int]) -> int:
    return math.lcm(*values)


def mamba_aligned_block_size(
    attention_specs: Sequence[KVCacheSpec],
    state_specs: Sequence[KVCacheSpec],
    block_size: int,
    multiple: int,
) -> int:
    """Smallest attention block size whose page holds the largest state.

    ``block_size`` is the engine's, ``multiple`` the platform's kernel block
    multiple; the result is ``k * cdiv(m, k * a)`` rounded up to ``multiple``,
    with ``k`` the block size rounded up to ``multiple`` (reference 6.4).
    """
    per_token = max(bytes_per_token(s) for s in attention_specs)
    state_bytes = max(s.real_page_size_bytes for s in state_specs)
    k = multiple * cdiv(block_size, multiple)
    aligned = k * cdiv(state_bytes, k * per_token)
    return max(block_size, multiple * cdiv(aligned, multiple))
