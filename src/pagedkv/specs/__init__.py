"""KV cache specs: one frozen dataclass per layer kind."""

from pagedkv.specs.base import AttentionSpec, KVCacheSpec
from pagedkv.specs.cross import CrossAttentionSpec, EncoderOnlyAttentionSpec
from pagedkv.specs.full import FullAttentionSpec, MLAAttentionSpec, SinkFullAttentionSpec
from pagedkv.specs.hidden import HiddenStateCacheSpec
from pagedkv.specs.hisparse import HiSparseHotSpec, HiSparseResidentSpec
from pagedkv.specs.local import ChunkedLocalAttentionSpec, SlidingWindowMLASpec, SlidingWindowSpec
from pagedkv.specs.mamba import MambaSpec
from pagedkv.specs.ring import CircularBufferSpec
from pagedkv.specs.rswa import RSWASpec
from pagedkv.specs.uniform import UniformTypeKVCacheSpecs

__all__ = [
    "AttentionSpec",
    "ChunkedLocalAttentionSpec",
    "CircularBufferSpec",
    "CrossAttentionSpec",
    "EncoderOnlyAttentionSpec",
    "FullAttentionSpec",
    "HiSparseHotSpec",
    "HiSparseResidentSpec",
    "HiddenStateCacheSpec",
    "KVCacheSpec",
    "MLAAttentionSpec",
    "MambaSpec",
    "RSWASpec",
    "SinkFullAttentionSpec",
    "SlidingWindowMLASpec",
    "SlidingWindowSpec",
    "UniformTypeKVCacheSpecs",
]
