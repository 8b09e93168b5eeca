"""A reference paged attention in plain torch: write through slots, read through tables.

Slow and simple on purpose: it is the oracle real kernels (and pagedkv's block
management) are checked against, not a kernel.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from pagedkv.specs import ChunkedLocalAttentionSpec, FullAttentionSpec, KVCacheSpec
from pagedkv.specs.local import SlidingWindowSpec
from pagedkv.tensors.errors import TensorLayoutError
from pagedkv.tensors.metadata import AttentionMetadata
from pagedkv.tensors.views import LayerView

__all__ = [
    "AttentionWindow",
    "window_for_spec",
    "attend",
    "block_size_of",
    "write_kv",
    "gather_kv",
    "gather_kv_rows",
    "paged_attention",
]


class AttentionWindow(NamedTuple):
    """Which earlier tokens a query sees: all, the last ``sliding_window``, or its chunk."""

    sliding_window: int | None = None
    chunk_size: int | None = None

    def key_start(self, positions: torch.Tensor) -> torch.Tensor:
        """First key position each query position attends to."""
        if self.sliding_window is not None:
            return (positions - self.sliding_window + 1).clamp(min=0)
        if self.chunk_size is not None:
            return positions // self.chunk_size * self.chunk_size
        return torch.zeros_like(positions)


def window_for_spec(spec: KVCacheSpec) -> AttentionWindow:
    """The window a layer computes with (a promoted local layer keeps its window)."""
    if isinstance(spec, SlidingWindowSpec):
        return AttentionWindow(sliding_window=spec.sliding_window)
    if isinstance(spec, ChunkedLocalAttentionSpec):
        return AttentionWindow(chunk_size=spec.attention_chunk_size)
    if isinstance(spec, FullAttentionSpec):
        return AttentionWindow(spec.sliding_window, spec.attention_chunk_size)
    return AttentionWindow()


def attend(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    query_positions: torch.Tensor,
    key_positions: torch.Tensor,
    window: AttentionWindow,
    scale: float | None = None,
) -> torch.Tensor:
    """Masked softmax attention: query ``[T, Hq, D]``, key ``[S, Hk, D]``, value ``[S, Hk, Dv]``
    (``Hq`` a multiple of ``Hk``) -> ``[T, Hq, Dv]``, computed in the query's dtype.

    Args:
        query: queries ``[T, Hq, D]``.
        key: keys ``[S, Hk, D]``.
        value: values ``[S, Hk, Dv]``.
        query_positions: the queries' token positions ``[T]``.
        key_positions: the keys' token positions ``[S]``.
        window: which keys each position sees.
        scale: the softmax scale (None: ``D ** -0.5``).
    """
    heads, kv_heads = query.shape[1], key.shape[1]
    key = key.to(query.dtype).repeat_interleave(heads // kv_heads, dim=1)
    value = value.to(query.dtype).repeat_interleave(heads // kv_heads, dim=1)
    scale = query.shape[-1] ** -0.5 if scale is None else scale
    scores = torch.einsum("qhd,khd->hqk", query, key) * scale
    kpos, qpos = key_positions[None, :], query_positions[:, None]
    visible = (kpos <= qpos) & (kpos >= window.key_start(query_positions)[:, None])
    probs = scores.masked_fill(~visible, float("-inf")).softmax(dim=-1)
    return torch.einsum("hqk,khd->qhd", probs, value)


def _block_offsets(slots: torch.Tensor, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    slots = slots.to(torch.int64)
    return slots // block_size, slots % block_size


_TOKEN_DIM = {"NHD": 2, "HND": 3, "latent": 1}


def block_size_of(view: LayerView) -> int:
    """Tokens per block of an attention or MLA layer's view."""
    dim = _TOKEN_DIM.get(view.layout)
    if dim is None:
        raise TensorLayoutError(f"layer {view.layer_name!r} ({view.layout}) has no token slots")
    return int(view.tensor.shape[dim])


def write_kv(
    view: LayerView,
    slot_mapping: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor | None = None,
) -> None:
    """Store each token's key (``[T, H, D]``) and value, or MLA latent (``[T, D]``), at its slot.

    Args:
        view: the layer's cache view.
        slot_mapping: each token's slot (block id * block size + offset) ``[T]``.
        key: keys ``[T, H, D]`` or MLA latents ``[T, D]``.
        value: values ``[T, H, D]`` (None for a latent layer).
    """
    cache = view.tensor
    blocks, offsets = _block_offsets(slot_mapping, block_size_of(view))
    if view.layout == "latent":
        cache[blocks, offsets] = key.to(cache.dtype)
        return
    if value is None:
        raise TensorLayoutError(f"layer {view.layer_name!r} stores K and V; pass both")
    if view.layout == "NHD":
        cache[blocks, 0, offsets] = key.to(cache.dtype)
        cache[blocks, 1, offsets] = value.to(cache.dtype)
    else:
        cache[blocks, 0, :, offsets] = key.to(cache.dtype)
        cache[blocks, 1, :, offsets] = value.to(cache.dtype)


def gather_kv(
    view: LayerView, block_row: torch.Tensor, positions: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Key ``[S, H, D]`` and value of ``positions`` through one block-table row
    (MLA: the latent as key with one head, and as value)."""
    bs = block_size_of(view)
    blocks = block_row.to(torch.int64)[positions // bs]
    offsets = positions % bs
    cache = view.tensor
    if view.layout == "latent":
        latent = cache[blocks, offsets][:, None, :]
        return latent, latent
    if view.layout == "NHD":
        return cache[blocks, 0, offsets], cache[blocks, 1, offsets]
    return cache[blocks, 0, :, offsets], cache[blocks, 1, :, offsets]


def gather_kv_rows(
    view: LayerView, block_table: torch.Tensor, positions: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Key ``[N, S, H, D]`` and value of ``positions`` (``[N, S]``) through the block-table
    rows ``[N, W]``, one request per row, in one indexing operation (MLA: the latent)."""
    bs = block_size_of(view)
    blocks = block_table.to(torch.int64).gather(1, positions // bs)
    offsets = positions % bs
    cache = view.tensor
    if view.layout == "latent":
        latent = cache[blocks, offsets][:, :, None, :]
        return latent, latent
    if view.layout == "NHD":
        return cache[blocks, 0, offsets], cache[blocks, 1, offsets]
    return cache[blocks, 0, :, offsets], cache[blocks, 1, :, offsets]


def paged_attention(
    view: LayerView,
    query: torch.Tensor,
    metadata: AttentionMetadata,
    *,
    window: AttentionWindow | None = None,
    scale: float | None = None,
    value_head_size: int | None = None,
    compute_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """Attention of every scheduled query (``[T, Hq, D]``) over its request's cached
    keys, read through ``metadata.block_table``. ``window`` defaults to the layer's own;
    ``value_head_size`` keeps the first dims of an MLA latent as the value.

    Args:
        view: the layer's cache view.
        query: the scheduled queries ``[T, Hq, D]``.
        metadata: the step's query starts, positions, block table and sequence lengths.
        window: which keys each position sees (None: the layer spec's).
        scale: the softmax scale (None: ``D ** -0.5``).
        value_head_size: dims of an MLA latent kept as the value (None: the whole row).
        compute_dtype: the dtype attention is computed in (None: at least float32).
    """
    window = window_for_spec(view.spec) if window is None else window
    dtype = compute_dtype or torch.promote_types(query.dtype, torch.float32)
    head_size_v = value_head_size or int(view.tensor.shape[-1])
    out = query.new_zeros((query.shape[0], query.shape[1], head_size_v), dtype=dtype)
    starts = metadata.query_start_loc.tolist()
    for i, seq_len in enumerate(metadata.seq_lens.tolist()):
        if starts[i] == starts[i + 1]:
            continue
        q_pos = metadata.positions[starts[i] : starts[i + 1]]
        first = int(window.key_start(q_pos.min()[None])[0])
        k_pos = torch.arange(first, seq_len, device=q_pos.device)
        key, value = gather_kv(view, metadata.block_table[i], k_pos)
        q = query[starts[i] : starts[i + 1]].to(dtype)
        out[starts[i] : starts[i + 1]] = attend(
            q, key, value[..., :head_size_v], q_pos, k_pos, window, scale
        )
    return out
