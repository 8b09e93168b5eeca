"""vLLM 0.33's KV event wire encoding (no ZeroMQ needed: the publisher and subscriber use it).

A published message has three frames: topic (``b""`` by default), an 8-byte big-endian
sequence number, and the msgpack ``EventBatch`` ``[ts, events, data_parallel_rank]``
(array-like). Each event is a msgpack map tagged by class name under ``"type"``; fields
equal to their default are left out, required ones are always sent (``None`` included).
Block hashes go out as external hashes: by default the low 64 bits of the hash as an
unsigned int (vLLM's default), or the raw bytes with ``int_block_hashes=False``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import NamedTuple

import msgspec

from pagedkv.errors import KVCacheRuntimeError
from pagedkv.runtime.events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    ExternalBlockHash,
    KVCacheEvent,
)
from pagedkv.runtime.hashing import BlockHash

__all__ = [
    "DEFAULT_TOPIC",
    "END_OF_REPLAY_SEQ",
    "AnyKVCacheEvent",
    "EventBatch",
    "EventFrames",
    "DecodedEventBatch",
    "external_block_hash",
    "to_external",
    "encode_payload",
    "encode_event_batch",
    "decode_payload",
    "decode_event_batch",
]

DEFAULT_TOPIC = b""
END_OF_REPLAY_SEQ = -1  # sequence number of the replay end marker (8 bytes of 0xff)
_MASK64 = (1 << 64) - 1

AnyKVCacheEvent = BlockStored | BlockRemoved | AllBlocksCleared


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """Events of one engine step, with a wall-clock timestamp in seconds."""

    ts: float
    events: list[AnyKVCacheEvent]
    data_parallel_rank: int | None = None


def external_block_hash(block_hash: BlockHash, int_block_hashes: bool = True) -> ExternalBlockHash:
    """The hash as published: low 64 bits as an unsigned int (default) or the raw bytes.

    Byte hashes are read big-endian (as vLLM does); int hashes (the ``builtin`` algorithm)
    are taken modulo 2**64, so negative ones become unsigned too.
    """
    if isinstance(block_hash, bytes):
        return int.from_bytes(block_hash[-8:], "big") if int_block_hashes else block_hash
    if isinstance(block_hash, int):
        if int_block_hashes:
            return block_hash & _MASK64
        return (block_hash & _MASK64).to_bytes(8, "big")
    raise KVCacheRuntimeError(
        f"a block hash must be bytes or int to be published, got {type(block_hash).__name__}"
    )


def to_external(event: KVCacheEvent, int_block_hashes: bool = True) -> KVCacheEvent:
    """A copy of ``event`` with its hashes in external form (``event`` is not changed)."""
    if isinstance(event, BlockStored):
        parent = event.parent_block_hash
        return msgspec.structs.replace(
            event,
            block_hashes=[external_block_hash(h, int_block_hashes) for h in event.block_hashes],
            parent_block_hash=(
                None if parent is None else external_block_hash(parent, int_block_hashes)
            ),
        )
    if isinstance(event, BlockRemoved):
        return msgspec.structs.replace(
            event,
            block_hashes=[external_block_hash(h, int_block_hashes) for h in event.block_hashes],
        )
    return event


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(EventBatch)


def encode_payload(
    events: Sequence[KVCacheEvent],
    *,
    ts: float | None = None,
    data_parallel_rank: int | None = 0,
    int_block_hashes: bool = True,
) -> bytes:
    """The msgpack payload of one batch, hashes converted to external form.

    Args:
        events: the batch's events, hashes in internal form.
        ts: the batch timestamp in seconds since the epoch (None: now).
        data_parallel_rank: the publishing engine's data-parallel rank (None: sent as nil).
        int_block_hashes: convert block hashes to integers (False: to bytes).
    """
    batch = EventBatch(
        ts=time.time() if ts is None else ts,
        events=[to_external(e, int_block_hashes) for e in events],  # type: ignore[misc]
        data_parallel_rank=data_parallel_rank,
    )
    return _encoder.encode(batch)


class EventFrames(NamedTuple):
    """The three ZeroMQ frames of one published batch."""

    topic: bytes
    sequence_number: bytes  # 8 big-endian bytes
    payload: bytes  # the msgpack-encoded EventBatch


class DecodedEventBatch(NamedTuple):
    """One received batch: its topic, sequence number and events."""

    topic: bytes
    sequence_number: int
    batch: EventBatch


def encode_event_batch(
    events: Sequence[KVCacheEvent],
    sequence_number: int,
    *,
    topic: bytes = DEFAULT_TOPIC,
    ts: float | None = None,
    data_parallel_rank: int | None = 0,
    int_block_hashes: bool = True,
) -> EventFrames:
    """The three frames (topic, sequence number, payload) of one published batch.

    Args:
        events: the batch's events, hashes in internal form.
        sequence_number: the batch's sequence number, sent as 8 big-endian bytes.
        topic: the topic frame.
        ts: the batch timestamp in seconds since the epoch (None: now).
        data_parallel_rank: the publishing engine's data-parallel rank (None: sent as nil).
        int_block_hashes: convert block hashes to integers (False: to bytes).
    """
    payload = encode_payload(
        events, ts=ts, data_parallel_rank=data_parallel_rank, int_block_hashes=int_block_hashes
    )
    return EventFrames(topic, sequence_number.to_bytes(8, "big"), payload)


def decode_payload(payload: bytes) -> EventBatch:
    """One batch from its msgpack payload; KVCacheRuntimeError if it is malformed."""
    try:
        return _decoder.decode(payload)
    except msgspec.DecodeError as exc:
        raise KVCacheRuntimeError(f"malformed KV event payload: {exc}") from exc


def decode_event_batch(frames: Sequence[bytes]) -> DecodedEventBatch:
    """Inverse of ``encode_event_batch``; KVCacheRuntimeError if the frames are malformed."""
    if len(frames) != 3 or len(frames[1]) != 8:
        raise KVCacheRuntimeError(
            "a KV event message has three frames (topic, 8-byte sequence number, payload), "
            f"got {len(frames)} frames"
        )
    return DecodedEventBatch(frames[0], int.from_bytes(frames[1], "big"), decode_payload(frames[2]))
