"""pagedkv: plan and manage the paged KV cache of LLM inference engines."""

# --- foundation: config, dtypes, errors, registry, specs, platforms ---
from pagedkv.config import CacheConfig, EngineConfig, ModelConfig, ParallelConfig, SchedulerConfig
from pagedkv.dtypes import KVCacheDtype, canonical_dtype_name, get_kv_dtype
from pagedkv.errors import (
    ConfigError,
    InsufficientMemoryError,
    KVCacheSpecError,
    ModelConfigError,
    NoFreeBlocksError,
    PagedKVError,
    PlanningError,
    PlatformError,
    RegistryError,
    TraceFormatError,
    UnknownDtypeError,
)
from pagedkv.platforms import Platform, get_current_platform, resolve_obj_by_qualname
from pagedkv.registry import KVCacheSpecMetadata, KVCacheSpecRegistry, register_kv_cache_spec
from pagedkv.specs import (
    AttentionSpec,
    ChunkedLocalAttentionSpec,
    CrossAttentionSpec,
    EncoderOnlyAttentionSpec,
    FullAttentionSpec,
    KVCacheSpec,
    MambaSpec,
    MLAAttentionSpec,
    SinkFullAttentionSpec,
    SlidingWindowMLASpec,
    SlidingWindowSpec,
    UniformTypeKVCacheSpecs,
)

# --- planning (planning/) ---
from pagedkv.planning import KVCacheConfig, KVCacheGroupSpec, KVCacheTensor, LayerRegion

# --- runtime (runtime/) ---

__version__ = "0.1.0"
