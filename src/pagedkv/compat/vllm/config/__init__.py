"""vLLM's ``vllm.config`` objects the KV cache layer reads: plain settings objects with
vLLM's field names and defaults, and ``to_engine_config`` for pagedkv's planner."""

from __future__ import annotations

from typing import Any

from pagedkv.compat.vllm._outside import outside_class
from pagedkv.compat.vllm.config._base import ConfigPart
from pagedkv.compat.vllm.config._engine_config import engine_config
from pagedkv.compat.vllm.config.attention import AttentionConfig, HiSparseConfig
from pagedkv.compat.vllm.config.cache import CacheConfig
from pagedkv.compat.vllm.config.kv_events import KVEventsConfig
from pagedkv.compat.vllm.config.model import ModelConfig
from pagedkv.compat.vllm.config.scheduler import SchedulerConfig
from pagedkv.compat.vllm.config.speculative import SpeculativeConfig
from pagedkv.config import EngineConfig

__all__ = [
    "AttentionConfig",
    "CacheConfig",
    "DeviceConfig",
    "HiSparseConfig",
    "KVEventsConfig",
    "KVTransferConfig",
    "ModelConfig",
    "ParallelConfig",
    "SchedulerConfig",
    "SpeculativeConfig",
    "VllmConfig",
]


class DeviceConfig(ConfigPart):
    DEFAULTS = {"device": "cpu"}


class ParallelConfig(ConfigPart):
    DEFAULTS = {
        "tensor_parallel_size": 1,
        "pipeline_parallel_size": 1,
        "data_parallel_size": 1,
        "decode_context_parallel_size": 1,
        "prefill_context_parallel_size": 1,
        "world_size": 1,
    }


class KVTransferConfig(ConfigPart):
    DEFAULTS = {"kv_connector": None, "kv_role": None, "kv_connector_extra_config": {}}


class ObservabilityConfig(ConfigPart):
    DEFAULTS = {"kv_cache_metrics": False, "kv_cache_metrics_sample": 0.01}


class LoRAConfig(ConfigPart):
    DEFAULTS = {"max_lora_rank": 16, "max_loras": 1}


class MultiModalConfig(ConfigPart):
    DEFAULTS = {}


ECTransferConfig = outside_class("ECTransferConfig", "encoder cache transfer", __name__)
DiffusionConfig = outside_class("DiffusionConfig", "diffusion model support", __name__)


class VllmConfig(ConfigPart):
    """The parts; ``to_engine_config()`` gives pagedkv's ``EngineConfig`` for the same
    model length, block size, parallelism, batch and speculative decoding."""

    DEFAULTS = {
        "speculative_config": None,
        "kv_transfer_config": None,
        "kv_events_config": None,
        "lora_config": None,
    }

    def __init__(self, **parts: Any) -> None:
        super().__init__(**parts)
        for name, cls in (
            ("model_config", None),
            ("cache_config", CacheConfig),
            ("parallel_config", ParallelConfig),
            ("scheduler_config", SchedulerConfig),
            ("device_config", DeviceConfig),
            ("attention_config", AttentionConfig),
            ("observability_config", ObservabilityConfig),
        ):
            if getattr(self, name, None) is None:
                setattr(self, name, None if cls is None else cls())

    @property
    def max_concurrent_batches(self) -> int:
        """Batches in flight at once: one per pipeline stage, two for async scheduling
        without pipeline parallelism."""
        batches = int(self.parallel_config.pipeline_parallel_size)
        if getattr(self.scheduler_config, "async_scheduling", False) and batches == 1:
            batches = 2
        return batches

    @property
    def max_in_flight_tokens(self) -> int:
        return int(self.max_concurrent_batches * self.scheduler_config.max_num_batched_tokens)

    @property
    def num_prefill_lookahead_tokens(self) -> int:
        """Prompt tokens past the computed range that the drafter reads (0 without an
        EAGLE-style drafter, its number of speculative tokens for multi-module MTP, else 1)."""
        spec = self.speculative_config
        if spec is None or not (spec.use_eagle() or spec.use_dflash() or spec.use_dspark()):
            return 0
        if spec.use_multi_module_mtp():
            return int(spec.num_speculative_tokens)
        return 1

    @property
    def num_hash_lookahead_tokens(self) -> int:
        """Tokens after each block that its hash covers (vLLM's lookahead block hashes):
        the prefill lookahead for a next-token drafter with prefix caching, else 0 (also
        when lookahead hashes or the EAGLE block drop are disabled, or a KV connector is
        configured: connectors keep the plain hashes)."""
        spec = self.speculative_config
        if (
            spec is None
            or not spec.use_eagle_block_drop()
            or getattr(spec, "disable_lookahead_block_hashes", False)
            or not self.cache_config.enable_prefix_caching
            or self.kv_transfer_config is not None
        ):
            return 0
        return int(self.num_prefill_lookahead_tokens)

    def to_engine_config(self) -> EngineConfig:
        return engine_config(self)
