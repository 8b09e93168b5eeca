"""The foundation's public names are importable from the top-level package."""

from __future__ import annotations

import pagedkv
import pagedkv.specs

FOUNDATION_NAMES = [
    # specs
    "KVCacheSpec",
    "AttentionSpec",
    "FullAttentionSpec",
    "SlidingWindowSpec",
    "ChunkedLocalAttentionSpec",
    "MLAAttentionSpec",
    "SlidingWindowMLASpec",
    "MambaSpec",
    "CrossAttentionSpec",
    "EncoderOnlyAttentionSpec",
    "SinkFullAttentionSpec",
    "UniformTypeKVCacheSpecs",
    # registry
    "KVCacheSpecRegistry",
    "KVCacheSpecMetadata",
    "register_kv_cache_spec",
    # config, dtypes
    "EngineConfig",
    "ModelConfig",
    "CacheConfig",
    "ParallelConfig",
    "SchedulerConfig",
    "KVCacheDtype",
    "get_kv_dtype",
    "canonical_dtype_name",
    # platforms
    "Platform",
    "get_current_platform",
    "resolve_obj_by_qualname",
    # errors
    "PagedKVError",
    "ConfigError",
    "UnknownDtypeError",
    "KVCacheSpecError",
    "RegistryError",
    "PlatformError",
]


def test_foundation_names_are_exported() -> None:
    missing = [name for name in FOUNDATION_NAMES if not hasattr(pagedkv, name)]
    assert missing == []


def test_specs_package_exports_every_spec() -> None:
    for name in pagedkv.specs.__all__:
        assert getattr(pagedkv, name) is getattr(pagedkv.specs, name)


def test_errors_share_one_base_and_are_value_or_runtime_errors() -> None:
    from pagedkv import errors

    for name in ("ConfigError", "UnknownDtypeError", "KVCacheSpecError", "RegistryError"):
        cls = getattr(errors, name)
        assert issubclass(cls, errors.PagedKVError)
        assert issubclass(cls, ValueError)
    assert issubclass(errors.PlatformError, errors.PagedKVError)
    assert issubclass(errors.PlatformError, RuntimeError)
