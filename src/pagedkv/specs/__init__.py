"""KV cache specs: one frozen dataclass per layer kind."""

from pagedkv.specs.base import AttentionSpec, KVCacheSpec
from pagedkv.specs.cross import CrossAttentionSpec, EncoderOnlyAttentionSpec
from pagedkv.specs.full import FullAttentionSpec, MLAAttentionSpec, SinkFullAttentionSpec
from pagedkv.specs.local import ChunkedLocalAttentionSpec, SlidingWindowMLASpec, SlidingWindowSpec
from pagedkv.specs.mamba import MambaSpec
from pagedkv.specs.uniform import UniformTypeKVCacheSpecs

__all__ = [
    "AttentionSpec",
    "ChunkedLocalAttentionSpec",
    "CrossAttentionSpec",
    "EncoderOnlyAttentionSpec",
    "FullAttentionSpec",
    "KVCacheSpec",
    "MLAAttentionSpec",
    "MambaSpec",
    "SinkFullAttentionSpec",
    "SlidingWindowMLASpec",
    "SlidingWindowSpec",
    "UniformTypeKVCacheSpecs",
]
