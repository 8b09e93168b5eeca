"""vLLM configs as pagedkv's ``EngineConfig``: the planner's inputs read off a vLLM
``VllmConfig`` or anything shaped like one (tests pass namespaces and mocks), keeping
only values of the type pagedkv expects."""

from __future__ import annotations

from enum import Enum
from typing import Any

from pagedkv.config import EngineConfig

__all__ = ["as_engine_config", "engine_config", "layout_name"]

# vLLM's legacy layout names and the KVCacheLayout each stands for.
_LEGACY_LAYOUTS = {"NHD": "LBNHC", "HND": "LBHNC"}


def _read(obj: Any, path: str, kind: type | tuple[type, ...], default: Any) -> Any:
    """``obj.a.b`` when it exists and is a ``kind`` (never a bool for int), else default."""
    for part in path.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return default
    if isinstance(obj, bool) and kind is int:
        return default
    return obj if isinstance(obj, kind) else default


def layout_name(value: Any) -> str | None:
    """A layout as vLLM's ``KVCacheLayout`` member name (None: not resolved)."""
    if isinstance(value, Enum):
        value = value.name
    if not isinstance(value, str) or not value:
        return None
    name = value.upper()
    return _LEGACY_LAYOUTS.get(name, name)


def _resolved_layout(cache: Any) -> str | None:
    name = layout_name(getattr(cache, "kv_cache_layout", None))
    if name is not None:
        return name
    resolve = getattr(cache, "get_resolved_kv_cache_layout", None)
    if callable(resolve) and not hasattr(resolve, "assert_called"):  # not a mock's
        try:
            return layout_name(resolve())
        except ValueError:
            return None
    return None


def _speculative_options(vllm_config: Any) -> dict[str, Any]:
    """The ``speculative_config`` as the planner's scheduler fields (none without a
    method): the method, its tokens, an MTP draft's modules and the block-drop switch."""
    method = _read(vllm_config, "speculative_config.method", str, None)
    if not method:
        return {}
    spec = vllm_config.speculative_config
    modules = _read(spec, "draft_model_config.hf_config.num_nextn_predict_layers", int, 1)
    return {
        "speculative_method": method,
        "num_speculative_tokens": max(0, _read(spec, "num_speculative_tokens", int, 0)),
        "num_draft_modules": max(1, modules),
        "disable_eagle_block_drop": _read(spec, "disable_eagle_block_drop", bool, False),
    }


def engine_config(vllm_config: Any) -> EngineConfig:
    """pagedkv's ``EngineConfig`` for a vLLM config (an ``EngineConfig`` is returned
    as is): model length, block size, layout, block override, hybrid switch,
    parallelism, batch and speculative decoding."""
    if isinstance(vllm_config, EngineConfig):
        return vllm_config
    cache = getattr(vllm_config, "cache_config", None)
    max_len = _read(vllm_config, "model_config.max_model_len", int, 8192)
    override = _read(cache, "num_gpu_blocks_override", int, None)
    disable_hybrid = _read(
        vllm_config, "scheduler_config.disable_hybrid_kv_cache_manager", bool, False
    )
    retention = getattr(cache, "prefix_cache_retention_interval", 0)
    options: dict[str, Any] = {
        "max_model_len": max_len if max_len > 0 or max_len == -1 else 8192,
        "block_size": _read(cache, "block_size", int, 16) or 16,
        "enable_prefix_caching": bool(_read(cache, "enable_prefix_caching", bool, True)),
        "num_gpu_blocks_override": override if override is None or override > 0 else None,
        "kv_cache_layout": _resolved_layout(cache),
        "enable_hybrid_kv_cache": not disable_hybrid,
        "prefix_cache_retention_interval": retention
        if retention is None or (type(retention) is int and retention >= 0)
        else 0,
        "tensor_parallel_size": max(
            1, _read(vllm_config, "parallel_config.tensor_parallel_size", int, 1)
        ),
        "pipeline_parallel_size": max(
            1, _read(vllm_config, "parallel_config.pipeline_parallel_size", int, 1)
        ),
        "max_num_batched_tokens": max(
            1, _read(vllm_config, "scheduler_config.max_num_batched_tokens", int, 8192)
        ),
        "max_num_seqs": max(1, _read(vllm_config, "scheduler_config.max_num_seqs", int, 256)),
        "async_scheduling": bool(
            _read(vllm_config, "scheduler_config.async_scheduling", bool, False)
        ),
    }
    return EngineConfig.create(**options, **_speculative_options(vllm_config))


def as_engine_config(config: Any) -> Any:
    """The ``EngineConfig`` a spec or planning helper reads: an ``EngineConfig`` as it is,
    a config class's own ``to_engine_config()``, ``engine_config`` for anything else
    shaped like vLLM's (a model or cache config: namespaces, mocks); any other object as it is
    (already engine-config shaped)."""
    if isinstance(config, EngineConfig):
        return config
    if callable(getattr(type(config), "to_engine_config", None)):  # not a mock's attribute
        return config.to_engine_config()
    if hasattr(config, "model_config") or hasattr(config, "cache_config"):
        return engine_config(config)
    return config
