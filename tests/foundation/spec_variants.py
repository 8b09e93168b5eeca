"""Valid example specs of every kind, and a way to change exactly one field of one."""

from __future__ import annotations

import dataclasses
from typing import Any

from pagedkv.specs import (
    ChunkedLocalAttentionSpec,
    CircularBufferSpec,
    CrossAttentionSpec,
    FullAttentionSpec,
    HiddenStateCacheSpec,
    HiSparseHotSpec,
    HiSparseResidentSpec,
    KVCacheSpec,
    MambaSpec,
    MLAAttentionSpec,
    RSWASpec,
    SinkFullAttentionSpec,
    SlidingWindowMLASpec,
    SlidingWindowSpec,
)

ATTN: dict[str, Any] = {"block_size": 16, "num_kv_heads": 8, "head_size": 128}

# One example of every registered kind.
MERGEABLE_EXAMPLES: list[KVCacheSpec] = [
    FullAttentionSpec(**ATTN),
    MLAAttentionSpec(block_size=16, head_size=576),
    SinkFullAttentionSpec(**ATTN, sink_len=16),
    SlidingWindowSpec(**ATTN, sliding_window=1024),
    SlidingWindowMLASpec(block_size=16, head_size=576, sliding_window=128),
    ChunkedLocalAttentionSpec(**ATTN, attention_chunk_size=8192),
    CrossAttentionSpec(**ATTN),
    MambaSpec(block_size=16, shapes=((4, 3), (4, 8)), dtypes=("bf16", "fp32")),
    RSWASpec(**ATTN, rswa_window=128),
    HiddenStateCacheSpec(block_size=16, head_size=4096),
    CircularBufferSpec(block_size=8, num_kv_heads=1, head_size=1024, head_size_v=0),
    HiSparseHotSpec(block_size=64, page_size=36864, blocks_per_request=32),
    HiSparseResidentSpec(block_size=64, page_size=36864),
    MLAAttentionSpec(
        block_size=256, head_size=512, tokens_per_state=4, model_version="deepseek_v4"
    ),
]

_ALTERNATIVE_DTYPE = {"bfloat16": "float16", "float16": "bfloat16"}


def altered(spec: KVCacheSpec, name: str) -> KVCacheSpec:
    """``spec`` with field ``name`` changed to another valid value (KeyError if unknown)."""
    value = getattr(spec, name)
    new: Any
    if name == "dtype":
        new = _ALTERNATIVE_DTYPE[value]
    elif name == "dtypes":
        new = tuple(_ALTERNATIVE_DTYPE.get(d, "bfloat16") for d in value)
    elif name == "shapes":
        new = tuple(tuple(d + 1 for d in shape) for shape in value)
    elif name == "page_size_padded":
        new = 2 * spec.page_size_bytes
    elif name == "mamba_type":
        new = "mamba1"
    elif name == "mamba_cache_mode":
        new = "align" if value == "none" else "none"
    elif name == "model_version":
        new = None if value else "deepseek_v4"
    elif name == "cache_dtype_str":
        new = "auto" if value != "auto" else "fp8_ds_mla"
    elif isinstance(value, bool):
        new = not value
    elif isinstance(value, int):
        new = value + 64 if name == "head_size_v" or value == 0 else value * 2
    elif value is None:
        new = 64
    else:
        raise KeyError(f"test does not know how to change {type(spec).__name__}.{name}")
    return dataclasses.replace(spec, **{name: new})


def compared_field_names(spec: KVCacheSpec) -> list[str]:
    return [f.name for f in dataclasses.fields(spec) if f.compare]
