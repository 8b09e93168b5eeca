"""The KV cache events the block pool and KVCacheManager emit (vLLM 0.33's event structs).

They hold the runtime's own block hashes; ``pagedkv.events.wire`` converts them to external
hashes and encodes them for the wire.
"""

from __future__ import annotations

from typing import Any

import msgspec

ExternalBlockHash = bytes | int


class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True, tag_field="type"):
    """Base of every KV cache event (encoded as a map tagged ``{"type": class name}``)."""


class BlockStored(KVCacheEvent):
    """Blocks became cached (reusable by later requests with the same prefix)."""

    block_hashes: list[ExternalBlockHash]
    parent_block_hash: ExternalBlockHash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    locality: str | None = None
    ownership: str | None = None
    session_id: str | None = None
    lookahead_token_ids: list[list[int]] | None = None


class BlockRemoved(KVCacheEvent):
    """Cached blocks were evicted (their content is no longer reusable)."""

    block_hashes: list[ExternalBlockHash]
    medium: str | None
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None


class AllBlocksCleared(KVCacheEvent):
    """The whole prefix cache was reset."""
