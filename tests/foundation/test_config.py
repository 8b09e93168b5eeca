from __future__ import annotations

import dataclasses

import pytest

from pagedkv.config import CacheConfig, EngineConfig, ModelConfig, ParallelConfig, SchedulerConfig
from pagedkv.errors import ConfigError, UnknownDtypeError


def test_defaults() -> None:
    config = EngineConfig()
    assert config.block_size == 16
    assert config.max_model_len == 8192
    assert config.kv_cache_dtype == "bfloat16"  # auto -> model dtype
    assert config.cache.enable_prefix_caching


def test_create_routes_flat_names_to_parts() -> None:
    config = EngineConfig.create(
        block_size=32,
        max_model_len=4096,
        tensor_parallel_size=2,
        pipeline_parallel_size=3,
        max_num_batched_tokens=2048,
        cache_dtype="fp8",
        enable_prefix_caching=False,
    )
    assert config.cache.block_size == 32
    assert config.model.max_model_len == 4096
    assert config.parallel.tensor_parallel_size == 2
    assert config.parallel.pipeline_parallel_size == 3
    assert config.scheduler.max_num_batched_tokens == 2048
    assert config.cache.cache_dtype == "fp8_e4m3"
    assert config.kv_cache_dtype == "fp8_e4m3"
    assert not config.cache.enable_prefix_caching


def test_replace_returns_new_config_and_keeps_others() -> None:
    base = EngineConfig.create(block_size=32, max_model_len=1000)
    changed = base.replace(max_model_len=2000)
    assert base.max_model_len == 1000
    assert changed.max_model_len == 2000
    assert changed.block_size == 32
    assert changed.parallel is base.parallel


def test_replace_accepts_whole_parts_then_flat_names() -> None:
    model = ModelConfig(name="m", max_model_len=100, dtype="fp16")
    config = EngineConfig.create(model=model, max_model_len=50)
    assert config.model.name == "m"
    assert config.model.dtype == "float16"
    assert config.max_model_len == 50


def test_unknown_option_lists_known() -> None:
    with pytest.raises(ConfigError, match=r"'blocksize'.*block_size"):
        EngineConfig.create(blocksize=16)


def test_config_is_frozen_and_hashable() -> None:
    config = EngineConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.model = ModelConfig()  # type: ignore[misc]
    assert hash(config) == hash(EngineConfig())
    assert config == EngineConfig()


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"block_size": 0}, "CacheConfig.block_size"),
        ({"block_size": -16}, "CacheConfig.block_size"),
        ({"block_size": 16.0}, "CacheConfig.block_size"),
        ({"block_size": True}, "CacheConfig.block_size"),
        ({"max_model_len": 0}, "ModelConfig.max_model_len"),
        ({"max_model_len": -2}, "ModelConfig.max_model_len"),
        ({"max_model_len": True}, "ModelConfig.max_model_len"),
        ({"tensor_parallel_size": 0}, "ParallelConfig.tensor_parallel_size"),
        ({"pipeline_parallel_size": -1}, "ParallelConfig.pipeline_parallel_size"),
        ({"max_num_batched_tokens": 0}, "SchedulerConfig.max_num_batched_tokens"),
        ({"max_num_seqs": 0}, "SchedulerConfig.max_num_seqs"),
        ({"max_num_encoder_input_tokens": 0}, "SchedulerConfig.max_num_encoder_input_tokens"),
        ({"num_lookahead_tokens": -1}, "SchedulerConfig.num_lookahead_tokens"),
        ({"num_lookahead_tokens": 1.5}, "SchedulerConfig.num_lookahead_tokens"),
        ({"num_lookahead_tokens": True}, "SchedulerConfig.num_lookahead_tokens"),
        ({"max_kv_cache_groups": 0}, "CacheConfig.max_kv_cache_groups"),
        ({"max_kv_cache_groups": 2.0}, "CacheConfig.max_kv_cache_groups"),
        ({"enable_hybrid_kv_cache": "no"}, "CacheConfig.enable_hybrid_kv_cache"),
        ({"gpu_memory_utilization": True}, "CacheConfig.gpu_memory_utilization"),
        ({"num_gpu_blocks_override": 0}, "CacheConfig.num_gpu_blocks_override"),
        ({"kv_cache_memory_bytes": -5}, "CacheConfig.kv_cache_memory_bytes"),
        ({"gpu_memory_utilization": 0}, "CacheConfig.gpu_memory_utilization"),
        ({"gpu_memory_utilization": 1.5}, "CacheConfig.gpu_memory_utilization"),
        ({"gpu_memory_utilization": "0.9"}, "CacheConfig.gpu_memory_utilization"),
        ({"mamba_cache_mode": "all"}, "CacheConfig.mamba_cache_mode"),
        ({"enable_prefix_caching": 1}, "CacheConfig.enable_prefix_caching"),
        ({"async_scheduling": "yes"}, "SchedulerConfig.async_scheduling"),
        ({"model": "llama"}, "EngineConfig.model"),
        ({"kv_cache_config_builder": "Builder"}, "ModelConfig.kv_cache_config_builder"),
        ({"kv_cache_config_builder": object}, "ModelConfig.kv_cache_config_builder"),
    ],
)
def test_invalid_options_name_the_field(options: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        EngineConfig.create(**options)


def test_parts_reject_wrong_types_directly() -> None:
    with pytest.raises(ConfigError, match=r"EngineConfig\.cache"):
        EngineConfig(cache=ParallelConfig())  # type: ignore[arg-type]


def test_unknown_cache_dtype() -> None:
    with pytest.raises(UnknownDtypeError, match="'fp7'"):
        CacheConfig(cache_dtype="fp7")
    with pytest.raises(UnknownDtypeError, match="'float7'"):
        ModelConfig(dtype="float7")


def test_max_model_len_minus_one_means_auto_fit() -> None:
    assert EngineConfig.create(max_model_len=-1).max_model_len == -1


def test_mamba_cache_mode_follows_prefix_caching_unless_set() -> None:
    assert CacheConfig(enable_prefix_caching=True).resolved_mamba_cache_mode == "align"
    assert CacheConfig(enable_prefix_caching=False).resolved_mamba_cache_mode == "none"
    assert CacheConfig(mamba_cache_mode="none").resolved_mamba_cache_mode == "none"


@pytest.mark.parametrize(
    ("pp", "async_scheduling", "batches"),
    [(1, False, 1), (1, True, 2), (4, False, 4), (4, True, 4)],
)
def test_in_flight_tokens(pp: int, async_scheduling: bool, batches: int) -> None:
    config = EngineConfig.create(
        pipeline_parallel_size=pp, async_scheduling=async_scheduling, max_num_batched_tokens=1000
    )
    assert config.max_concurrent_batches == batches
    assert config.max_in_flight_tokens == batches * 1000


def test_encoder_tokens_default_to_batch_budget() -> None:
    assert EngineConfig.create(max_num_batched_tokens=512).max_num_encoder_input_tokens == 512
    config = EngineConfig.create(max_num_encoder_input_tokens=1500)
    assert config.max_num_encoder_input_tokens == 1500


def test_parts_are_keyword_only() -> None:
    with pytest.raises(TypeError):
        SchedulerConfig(100)  # type: ignore[misc]
