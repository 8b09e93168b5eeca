"""pagedkv: plan and manage the paged KV cache of LLM inference engines."""

# --- foundation: config, dtypes, errors, registry, specs, platforms ---
from pagedkv.config import CacheConfig, EngineConfig, ModelConfig, ParallelConfig, SchedulerConfig
from pagedkv.dtypes import KVCacheDtype, canonical_dtype_name, get_kv_dtype
from pagedkv.errors import (
    ConfigError,
    InsufficientMemoryError,
    KVCacheRuntimeError,
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
    CircularBufferSpec,
    CrossAttentionSpec,
    EncoderOnlyAttentionSpec,
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
    UniformTypeKVCacheSpecs,
)

# --- planning (planning/) and its capacity report (capacity/) ---
from pagedkv.capacity import (
    ConcurrencyPoint,
    GroupingAlternative,
    GroupReport,
    KVCachePlan,
    WorkerReport,
    plan_kv_cache,
)
from pagedkv.planning import (
    DefaultKVCacheConfigBuilder,
    KVCacheConfig,
    KVCacheConfigBuilder,
    KVCacheGroupSpec,
    KVCacheTensor,
    LayerRegion,
    SupportsKVCacheGrouping,
    VLLMRuleKVCacheConfigBuilder,
    get_kv_cache_config_builder,
    get_kv_cache_configs,
)

# --- runtime (runtime/) ---
from pagedkv.runtime import (
    NULL_BLOCK,
    AllBlocksCleared,
    BlockHasher,
    BlockPool,
    BlockRemoved,
    BlockStored,
    ChunkedLocalAttentionManager,
    CrossAttentionManager,
    FullAttentionManager,
    HybridCoordinator,
    KVCacheBlocks,
    KVCacheCoordinator,
    KVCacheEvent,
    KVCacheManager,
    MambaManager,
    MultiModalFeature,
    NoPrefixCacheCoordinator,
    PrefixCacheStats,
    Request,
    SingleTypeKVCacheManager,
    SlidingWindowManager,
    UnitaryCoordinator,
    get_hash_fn,
    hash_token_blocks,
    make_coordinator,
    register_builtin_kv_cache_specs,
    sha256_cbor,
    xxhash128,
)

# --- KV event wire encoding (events/wire.py: no ZeroMQ needed) ---
from pagedkv.events.wire import EventBatch, decode_event_batch, encode_event_batch

# --- models (models/) ---
from pagedkv.models import (
    GPU,
    ModelAdapter,
    ModelLayout,
    ModelSource,
    describe_model,
    engine_config_for,
    estimate_weight_bytes,
    get_gpu,
    get_kv_cache_specs,
    list_bundled_models,
    list_gpus,
    load_model_config,
    memory_budgets,
    register_model_adapter,
)

# --- "plan this model on that GPU with these vLLM flags" (deployment/) ---
from pagedkv.deployment import DeploymentPlan, PlanRequest, VLLMFlags, plan

from pagedkv._version import __version__

# --- simulation (sim/): imported on first use, so `import pagedkv` stays fast ---
_SIM_EXPORTS = frozenset(
    {
        "SchedulerSettings",
        "SimEngine",
        "SimResult",
        "Trace",
        "TraceRequest",
        "engine_from_model",
        "load_trace",
        "simulate",
        "sweep",
        "synthetic_trace",
    }
)


def __getattr__(name: str) -> object:
    if name in _SIM_EXPORTS:
        import pagedkv.sim

        return getattr(pagedkv.sim, name)
    raise AttributeError(f"module 'pagedkv' has no attribute {name!r}")
