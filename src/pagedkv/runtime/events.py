"""The KV cache events the block pool and KVCacheManager emit (vLLM 0.33's event structs).

They hold the runtime's own block hashes; ``pagedkv.events.wire`` converts them to external
hashes and encodes them for the wire.
"""

from __future__ import annotations

from typing import Any

import msgspec

from pagedkv.registry import KVCacheSpecRegistry
from pagedkv.specs.base import KVCacheSpec
from pagedkv.specs.full import FullAttentionSpec
from pagedkv.specs.local import SlidingWindowSpec
from pagedkv.specs.uniform import UniformTypeKVCacheSpecs

__all__ = [
    "ExternalBlockHash",
    "EVENT_SPEC_KINDS",
    "KVCacheEvent",
    "BlockStored",
    "BlockRemoved",
    "AllBlocksCleared",
    "event_spec_kind",
    "event_sliding_window",
]

ExternalBlockHash = bytes | int

# The kinds vLLM 0.33 names in BlockStored.kv_cache_spec_kind (any other spec: "unknown").
EVENT_SPEC_KINDS = frozenset(
    {
        "full_attention",
        "mla_attention",
        "sliding_window",
        "sliding_window_mla",
        "mamba",
        "chunked_local_attention",
        "sink_full_attention",
        "encoder_only_attention",
        "cross_attention",
    }
)


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


def event_spec_kind(spec: KVCacheSpec) -> str:
    """``kv_cache_spec_kind`` of a group's BlockStored events: the nearest kind vLLM names
    in the spec's class hierarchy; a uniform-type group's common kind, "full_attention"
    for mixed full-attention layers, else "unknown"."""
    if isinstance(spec, UniformTypeKVCacheSpecs):
        kinds = {event_spec_kind(s) for s in spec.kv_cache_specs.values()}
        if len(kinds) == 1:
            return kinds.pop()
        bases = {
            KVCacheSpecRegistry.get_uniform_type_base_spec(s) for s in spec.kv_cache_specs.values()
        }
        return "full_attention" if bases == {FullAttentionSpec} else "unknown"
    named = spec.vllm_kind  # a kind vLLM names differently says so
    if named in EVENT_SPEC_KINDS or named == "unknown":
        return named
    for cls in type(spec).__mro__:
        kind = cls.__dict__.get("kind")
        if kind in EVENT_SPEC_KINDS:
            return str(kind)
    return "unknown"


def event_sliding_window(spec: KVCacheSpec) -> int | None:
    """``kv_cache_spec_sliding_window``: a sliding-window spec's window (a uniform-type
    group's if all its layers agree), else None."""
    if isinstance(spec, UniformTypeKVCacheSpecs):
        windows = {event_sliding_window(s) for s in spec.kv_cache_specs.values()}
        return windows.pop() if len(windows) == 1 else None
    return spec.sliding_window if isinstance(spec, SlidingWindowSpec) else None
