"""Block tables and slot mappings, as an engine hands them to attention kernels."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch

from pagedkv.tensors.errors import BlockTableError

__all__ = [
    "PAD_BLOCK_ID",
    "ScheduledRequest",
    "AttentionMetadata",
    "block_table_tensor",
    "slot_mapping",
    "build_attention_metadata",
]

PAD_BLOCK_ID = 0  # padded block-table entries point at the null block


class ScheduledRequest(NamedTuple):
    """One request's share of a step: the runtime's block ids (one list per group) and
    the token range ``[num_computed_tokens, num_computed_tokens + num_new_tokens)``."""

    block_ids: Sequence[Sequence[int]]
    num_computed_tokens: int
    num_new_tokens: int

    @property
    def seq_len(self) -> int:
        return self.num_computed_tokens + self.num_new_tokens


class AttentionMetadata(NamedTuple):
    """One KV cache group's inputs for one step.

    ``block_table``: ``[num_reqs, max_blocks]`` int32, rows padded with the null block;
    ``slot_mapping``: ``[num_tokens]`` int64, ``block_id * block_size + offset`` of every
    scheduled token; ``query_start_loc``: ``[num_reqs + 1]`` int32 prefix sums of new
    tokens; ``seq_lens``: ``[num_reqs]`` int32 context lengths after the step;
    ``positions``: ``[num_tokens]`` int64 token positions.
    """

    block_size: int
    block_table: torch.Tensor
    slot_mapping: torch.Tensor
    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    positions: torch.Tensor


def block_table_tensor(
    rows: Sequence[Sequence[int]], device: str | torch.device = "cpu", *, width: int | None = None
) -> torch.Tensor:
    """``rows`` as one ``[len(rows), width]`` int32 tensor padded with the null block."""
    width = max((len(r) for r in rows), default=0) if width is None else width
    padded: list[list[int]] = []
    for i, row in enumerate(rows):
        if len(row) > width:
            raise BlockTableError(f"block-table row {i} has {len(row)} blocks, wider than {width}")
        padded.append([*row, *([PAD_BLOCK_ID] * (max(width, 1) - len(row)))])
    if not padded:
        return torch.full((0, max(width, 1)), PAD_BLOCK_ID, dtype=torch.int32, device=device)
    return torch.tensor(padded, dtype=torch.int32).to(device)


def slot_mapping(
    block_ids: Sequence[int], positions: torch.Tensor, block_size: int
) -> torch.Tensor:
    """Slot of each position: ``block_ids[pos // block_size] * block_size + pos % block_size``."""
    table = torch.as_tensor(list(block_ids), dtype=torch.int64)
    positions = positions.to(torch.int64).cpu()
    if len(positions) and int(positions.max()) >= len(table) * block_size:
        raise BlockTableError(
            f"position {int(positions.max())} is past the {len(table)} allocated blocks "
            f"of {block_size} tokens"
        )
    return table[positions // block_size] * block_size + positions % block_size


def build_attention_metadata(
    requests: Sequence[ScheduledRequest],
    block_sizes: Sequence[int],
    device: str | torch.device = "cpu",
) -> tuple[AttentionMetadata, ...]:
    """Per-group metadata for one step, requests in order, tokens concatenated."""
    counts = torch.tensor([r.num_new_tokens for r in requests], dtype=torch.int64)
    starts = torch.tensor([r.num_computed_tokens for r in requests], dtype=torch.int64)
    query_start_loc = torch.cumsum(
        torch.cat([torch.zeros(1, dtype=torch.int64), counts]), 0, dtype=torch.int32
    )
    # token t of the step belongs to request_of[t], at position starts + its index in the chunk
    request_of = torch.repeat_interleave(torch.arange(len(requests)), counts)
    positions = torch.arange(int(counts.sum())) - query_start_loc[request_of] + starts[request_of]
    seq_lens = (starts + counts).to(torch.int32)
    groups = []
    for gid, block_size in enumerate(block_sizes):
        rows = [r.block_ids[gid] for r in requests]
        table = block_table_tensor(rows)
        groups.append(
            AttentionMetadata(
                block_size,
                table.to(device),
                _slots(table, rows, request_of, positions, block_size).to(device),
                query_start_loc.to(device),
                seq_lens.to(device),
                positions.to(device),
            )
        )
    return tuple(groups)


def _slots(
    table: torch.Tensor,
    rows: Sequence[Sequence[int]],
    request_of: torch.Tensor,
    positions: torch.Tensor,
    block_size: int,
) -> torch.Tensor:
    """Every scheduled token's slot, read from its request's row of ``table``."""
    block_index = positions // block_size
    widths = torch.tensor([len(row) for row in rows], dtype=torch.int64)
    past = block_index >= widths[request_of]
    if bool(past.any()):
        token = int(past.nonzero()[0, 0])
        raise BlockTableError(
            f"position {int(positions[token])} is past the {int(widths[request_of[token]])} "
            f"allocated blocks of {block_size} tokens"
        )
    return table.to(torch.int64)[request_of, block_index] * block_size + positions % block_size
