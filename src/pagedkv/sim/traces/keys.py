"""Chained block keys computed from a request's segments (no token ids needed).

Two blocks get the same key exactly when their token ids and all tokens before them are
equal under :mod:`pagedkv.sim.traces.tokens` (up to 64-bit hash collisions): the key of block
``i`` hashes the key of block ``i - 1`` with the (segment, offset, length) pieces it covers.
"""

from __future__ import annotations

from pagedkv.sim.traces.trace import Segment, TraceRequest

__all__ = [
    "full_sequence",
    "chain_keys",
]


def full_sequence(request: TraceRequest) -> tuple[Segment, ...]:
    """Prompt segments followed by the output stream the simulator generates."""
    return (*request.segments, Segment(request.output_segment_id, request.num_output_tokens))


def chain_keys(segments: tuple[Segment, ...], block_size: int, num_blocks: int) -> list[int]:
    """Keys of the first ``num_blocks`` full blocks of ``block_size`` tokens."""
    keys: list[int] = []
    parent = 0
    pieces: list[tuple[int, int, int]] = []
    room = block_size
    for seg_id, length, *_ in segments:
        # CPython hashes -1 like -2 (the per-request output and filler ids of request 0);
        # doubled ids hash apart (Python's int hash is the identity below 2**61 - 1
        # except for -1, which no doubled id is).
        seg_id *= 2
        offset = 0
        while offset < length and len(keys) < num_blocks:
            if room == block_size and length - offset >= block_size:
                parent = hash((parent, seg_id, offset))
                keys.append(parent)
                offset += block_size
                continue
            take = min(room, length - offset)
            pieces.append((seg_id, offset, take))
            offset += take
            room -= take
            if room == 0:
                parent = hash((parent, tuple(pieces)))
                keys.append(parent)
                pieces.clear()
                room = block_size
        if len(keys) >= num_blocks:
            break
    return keys
