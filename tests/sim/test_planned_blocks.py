"""--num-blocks and sweep sizes are planned by the planner (num_gpu_blocks_override)."""

from __future__ import annotations

import dataclasses

import pytest

from pagedkv.errors import ConfigError, InsufficientMemoryError
from pagedkv.sim import load_trace, simulate
from pagedkv.sim.setup import setup_from_model

from .helpers import make_setup


def _bytes_per_block(setup) -> int:
    return setup.kv_cache_config.device_bytes // setup.num_blocks


def test_resized_engine_has_tensors_and_length_for_its_block_count():
    big = setup_from_model("Llama-3.1-8B", gpu="H100-80GB")
    per_block = _bytes_per_block(big)
    small = big.with_num_blocks(100)
    cfg = small.kv_cache_config
    assert cfg.num_blocks == 100
    assert cfg.device_bytes == 100 * per_block  # not the 28,535-block tensor
    assert all(t.size <= 100 * per_block for t in cfg.kv_cache_tensors)
    # auto-fitted: one request of max_model_len fits into the 99 usable blocks
    assert small.max_model_len == cfg.max_model_len == 99 * 16
    assert small.config.max_model_len == small.max_model_len
    assert small.config.cache.num_gpu_blocks_override == 100


def test_num_blocks_plans_like_resizing_and_keeps_the_model_length_when_it_fits():
    direct = setup_from_model("Llama-3.1-8B", num_blocks=100)
    resized = setup_from_model("Llama-3.1-8B", gpu="H100-80GB").with_num_blocks(100)
    assert direct.kv_cache_config == resized.kv_cache_config
    roomy = setup_from_model("Llama-3.1-8B", num_blocks=10_000)
    assert roomy.max_model_len == 131072  # the model's limit: no need to shrink it


def test_explicit_max_model_len_too_long_for_the_blocks_is_an_error():
    with pytest.raises(InsufficientMemoryError, match=r"100 KV cache blocks.*8192"):
        setup_from_model("Llama-3.1-8B", num_blocks=100, max_model_len=8192)
    fits = setup_from_model("Llama-3.1-8B", num_blocks=600, max_model_len=8192)
    assert fits.max_model_len == 8192


def test_sweep_sizes_run_with_consistent_configs():
    setup = setup_from_model("Llama-3.1-8B", num_blocks=400)
    trace = load_trace("synthetic:12:3")
    for num_blocks in (50, 400):
        resized = setup.with_num_blocks(num_blocks)
        result = simulate(resized, trace, bound=True)
        assert result.num_blocks == num_blocks
        assert resized.kv_cache_config.device_bytes == num_blocks * _bytes_per_block(setup)
        assert result.bound_hit_rate >= result.hit_rate


def test_hand_built_config_with_tensors_is_not_resized_silently():
    setup = setup_from_model("Llama-3.1-8B", num_blocks=100)
    hand_built = dataclasses.replace(setup, plan_inputs=None)
    with pytest.raises(ConfigError, match="hand-built"):
        hand_built.with_num_blocks(200)
    layout_only = make_setup(10).with_num_blocks(20)  # no tensors: resized as is
    assert layout_only.num_blocks == 20
