"""KV cache events for routers and offload layers, in the wire layout vLLM and SGLang publish.

Events are msgspec structs, tagged by class name and encoded as arrays, so a consumer
written for vLLM's ``KVEventBatch`` decodes them unchanged. A published message has three
frames: topic, an 8-byte big-endian sequence number, and the msgpack ``EventBatch``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import msgspec

from pagedkv.errors import KVCacheRuntimeError

ExternalBlockHash = bytes | int
DEFAULT_TOPIC = b"kv-events"


class KVCacheEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    """Base of every KV cache event."""


class BlockStored(KVCacheEvent):
    """Blocks became cached (reusable by later requests with the same prefix)."""

    block_hashes: list[ExternalBlockHash]
    parent_block_hash: ExternalBlockHash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None = None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None


class BlockRemoved(KVCacheEvent):
    """Cached blocks were evicted (their content is no longer reusable)."""

    block_hashes: list[ExternalBlockHash]
    medium: str | None
    group_idx: int | None = None


class AllBlocksCleared(KVCacheEvent):
    """The whole prefix cache was reset."""


AnyKVCacheEvent = BlockStored | BlockRemoved | AllBlocksCleared


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """Events of one engine step, with a wall-clock timestamp in seconds."""

    ts: float
    events: list[AnyKVCacheEvent]
    data_parallel_rank: int | None = None


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(EventBatch)


def encode_event_batch(
    events: Sequence[KVCacheEvent],
    sequence_number: int,
    *,
    topic: bytes = DEFAULT_TOPIC,
    ts: float | None = None,
    data_parallel_rank: int | None = None,
) -> tuple[bytes, bytes, bytes]:
    """The three frames (topic, sequence number, payload) of one published batch."""
    batch = EventBatch(
        ts=time.time() if ts is None else ts,
        events=list(events),  # type: ignore[arg-type]
        data_parallel_rank=data_parallel_rank,
    )
    return topic, sequence_number.to_bytes(8, "big"), _encoder.encode(batch)


def decode_event_batch(frames: Sequence[bytes]) -> tuple[bytes, int, EventBatch]:
    """Inverse of ``encode_event_batch``; KVCacheRuntimeError if the frames are malformed."""
    if len(frames) != 3 or len(frames[1]) != 8:
        raise KVCacheRuntimeError(
            "a KV event message has three frames (topic, 8-byte sequence number, payload), "
            f"got {len(frames)} frames"
        )
    try:
        batch = _decoder.decode(frames[2])
    except msgspec.DecodeError as exc:
        raise KVCacheRuntimeError(f"malformed KV event payload: {exc}") from exc
    return frames[0], int.from_bytes(frames[1], "big"), batch
