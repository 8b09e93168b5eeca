"""Mamba states in pagedkv's state blocks, for transformers' Mamba mixers.

A hybrid model runs one request per forward pass (a Mamba mixer scans along the whole
sequence, so requests cannot be packed). Before the pass each Mamba layer's conv and
recurrent state are read from the request's state block for its computed tokens (none
for a fresh request: the mixer starts from zeros); the mixer updates working copies;
after the pass they are written into the block for the new end of the request.

pagedkv's conv state keeps the last ``d_conv - 1`` inputs (vLLM's shape);
transformers keeps ``d_conv`` and always drops the oldest before using it, so the
extra column is zero on the way in and dropped on the way out.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import NamedTuple

import torch

from pagedkv.hf.attention import HFIntegrationError
from pagedkv.hf.scheduler import end_of
from pagedkv.tensors import LayerView
from pagedkv.tensors.workload import ScheduledChunk

__all__ = [
    "StateBlocks",
    "StateIO",
    "state_pieces",
    "state_blocks",
]


class StateBlocks(NamedTuple):
    """The block holding the state at the pass's start (None: a fresh request) and the
    block that receives the state at its end, for one Mamba group."""

    read: int | None
    write: int


class StateIO:
    """Working copies of one request's Mamba states for one forward pass."""

    def __init__(self, views: Mapping[int, LayerView], blocks: Mapping[int, StateBlocks]) -> None:
        self.views = views  # Mamba layers by decoder index
        self.blocks = blocks  # by group id
        self.conv: dict[int, torch.Tensor] = {}
        self.recurrent: dict[int, torch.Tensor] = {}
        self.loaded: set[int] = set()

    def _load(self, layer_idx: int) -> None:
        if layer_idx in self.loaded:
            return
        self.loaded.add(layer_idx)
        view = self._view(layer_idx)
        read = self.blocks[view.group_id].read
        if read is None:
            return
        conv, recurrent = view.tensors[0][read], view.tensors[1][read]
        self.conv[layer_idx] = torch.nn.functional.pad(conv, (1, 0))[None].clone()
        self.recurrent[layer_idx] = recurrent[None].clone()

    def _view(self, layer_idx: int) -> LayerView:
        view = self.views.get(layer_idx)
        if view is None or len(view.tensors) != 2:
            raise HFIntegrationError(
                f"decoder layer {layer_idx} asked for a Mamba state but has no "
                "(conv, recurrent) state layer in the plan"
            )
        return view

    def conv_state(self, layer_idx: int) -> torch.Tensor | None:
        self._load(layer_idx)
        return self.conv.get(layer_idx)

    def recurrent_state(self, layer_idx: int) -> torch.Tensor | None:
        self._load(layer_idx)
        return self.recurrent.get(layer_idx)

    def update_conv(
        self, inputs: torch.Tensor, layer_idx: int, kernel_size: int | None
    ) -> torch.Tensor:
        """transformers' contract: return the previous inputs followed by ``inputs``
        (zero-padded to the kernel for a fresh request) and keep the last ``kernel``."""
        self._load(layer_idx)
        kernel = kernel_size or int(self._view(layer_idx).tensors[0].shape[-1]) + 1
        previous = self.conv.get(layer_idx)
        if previous is None:
            full = torch.nn.functional.pad(inputs, (max(0, kernel - inputs.shape[-1]), 0))
        else:
            full = torch.cat([previous, inputs], dim=-1)
        self.conv[layer_idx] = full[..., -kernel:].clone()
        return full

    def update_recurrent(self, state: torch.Tensor, layer_idx: int) -> torch.Tensor:
        self._load(layer_idx)
        self.recurrent[layer_idx] = state
        return state

    def save(self) -> None:
        """Write every layer's final states into its group's write block."""
        for layer_idx, view in self.views.items():
            if layer_idx not in self.conv or layer_idx not in self.recurrent:
                raise HFIntegrationError(
                    f"Mamba layer {view.layer_name!r} produced no state in this pass"
                )
            write = self.blocks[view.group_id].write
            view.tensors[0][write] = self.conv[layer_idx][0, :, 1:]
            view.tensors[1][write] = self.recurrent[layer_idx][0]


def state_pieces(
    chunk: ScheduledChunk, block_size: int | None, tables: Sequence[Sequence[int]]
) -> list[ScheduledChunk]:
    """``chunk`` cut at every checkpoint (``block_size`` boundary) inside it that has a
    real block in every state group's table, so each checkpoint block receives the state
    after exactly its last token. A boundary the runtime left null (positions a chunk
    spans get placeholders in vLLM's align mode) keeps no state and is not cut at;
    ``block_size`` None (mode "none") cuts nowhere."""
    start, end = chunk.num_computed_tokens, end_of(chunk)
    if block_size is None:
        return [chunk]
    first_cut = start - start % block_size + block_size
    cuts = [
        b
        for b in range(first_cut, end, block_size)
        if all((b - 1) // block_size < len(t) and t[(b - 1) // block_size] for t in tables)
    ]
    bounds = [start, *cuts, end]
    return [ScheduledChunk(chunk.request, a, b - a) for a, b in itertools.pairwise(bounds)]


def state_blocks(
    piece: ScheduledChunk, block_ids: Sequence[Sequence[int]], block_sizes: Mapping[int, int]
) -> dict[int, StateBlocks]:
    """Per Mamba group (``block_sizes`` by group id): the block with the state at the
    piece's start and the one for its end. Block ``i`` holds the state after token
    ``(i + 1) * block_size``, or the running state of a request that ends inside it."""
    start, end = piece.num_computed_tokens, end_of(piece)
    return {
        gid: StateBlocks(
            _block_for(piece, block_ids[gid], gid, size, start) if start else None,
            _block_for(piece, block_ids[gid], gid, size, end),
        )
        for gid, size in block_sizes.items()
    }


def _block_for(
    piece: ScheduledChunk, table: Sequence[int], gid: int, block_size: int, num_tokens: int
) -> int:
    index = (num_tokens - 1) // block_size
    block = table[index] if index < len(table) else 0
    if not block:
        raise HFIntegrationError(
            f"request {piece.request.request_id!r}: Mamba group {gid} has no state block for "
            f"token {num_tokens} (block index {index}, table {list(table)})"
        )
    return block
